"""Paths of run folders and checkpoints: `etils.epath.Path`, the type orbax uses, so a folder may
be local or on storage orbax writes to (`gs://bucket/...`, `s3://...`)."""
from __future__ import annotations

import os
import re

from etils import epath

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def path(p: str | os.PathLike) -> epath.Path:
  """A run-folder path: local (`runs/x`, `/data/x`) or on cloud storage (`gs://bucket/x`)."""
  return p if isinstance(p, epath.Path) else epath.Path(p)


def is_local(p: str | os.PathLike) -> bool:
  """Whether `p` is on the local file system (no `scheme://` prefix)."""
  return not _URI.match(os.fspath(p))


# What epath needs to open each kind of cloud folder (TensorFlow's file system opens all of them),
# and the package extra that installs it.
_STORAGE = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", None)}


class StorageError(ValueError):
  """A cloud folder whose file-system package is not installed."""


def check_storage(p: str | os.PathLike, flag: str = "--workdir") -> None:
  """Raise StorageError (one line, naming the package and the extra that installs it) where `p` is
  on cloud storage that nothing installed here can open; before any work is done."""
  import importlib.util
  scheme = os.fspath(p).split("://", 1)[0] if not is_local(p) else None
  if scheme not in _STORAGE:
    return
  package, extra = _STORAGE[scheme]
  if importlib.util.find_spec(package) is None and importlib.util.find_spec("tensorflow") is None:
    how = f"pip install 'maskprior-jax[{extra}]'" if extra else f"pip install {package}"
    raise StorageError(f"{flag} {os.fspath(p)} is on {scheme}:// storage, which needs {package} (not installed): "
                       f"{how}")


_GCS = "https://storage.googleapis.com"
_CHECK_TIMEOUT_S = 10


def check_reachable(p: str | os.PathLike, flag: str = "--workdir") -> None:
  """Raise StorageError (one line: the folder, the cause, what to do) where a gs:// folder cannot be
  used: no credentials, Cloud Storage unreachable, no such bucket, or no permission to list and write
  there. Checked before any work, within seconds (one request each, no retries), leaving nothing
  behind: the write is a probe object, deleted at once. Local and other cloud folders pass unchecked.
  With STORAGE_EMULATOR_HOST set (a local emulator, as gcsfs reads it) no credentials are needed."""
  folder = os.fspath(p)
  if is_local(p) or not folder.startswith("gs://"):
    return
  try:
    import requests
  except ImportError:   # gcsfs (which brings requests and google-auth) absent: check_storage said so
    return
  bucket, _, prefix = folder[len("gs://"):].partition("/")
  emulator = os.environ.get("STORAGE_EMULATOR_HOST")
  where = f"{flag} {folder}"
  import logging
  from google.auth import exceptions as auth
  quiet = [logging.getLogger(n) for n in ("urllib3", "google.auth")]   # their retry and project warnings:
  levels = [q.level for q in quiet]                                     # the line below says what failed
  for q in quiet:
    q.setLevel(logging.ERROR)
  try:
    if emulator:
      session, base = requests.Session(), emulator if "://" in emulator else f"http://{emulator}"
    else:
      session, base = _authorized_session(where), _GCS
    _probe(session, base, bucket, prefix.strip("/"))
  except (requests.RequestException, auth.TransportError) as e:   # (the latter: fetching a token)
    raise StorageError(f"{where}: cannot reach Cloud Storage at {base} ({_cause(e)}); check the network"
                       + (" and STORAGE_EMULATOR_HOST" if emulator else "")) from None
  except auth.RefreshError as e:
    raise StorageError(f"{where}: the Google Cloud credentials found were refused ({_cause(e)}); run `gcloud "
                       "auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a valid key "
                       "file)") from None
  except _Refused as e:
    raise StorageError(f"{where}: {e}") from None
  finally:
    for q, level in zip(quiet, levels):
      q.setLevel(level)


class _Refused(Exception):
  pass


def _authorized_session(where: str):
  import google.auth
  from google.auth import exceptions
  from google.auth.transport.requests import AuthorizedSession
  try:
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
  except exceptions.DefaultCredentialsError:
    raise StorageError(f"{where}: no Google Cloud credentials found; run `gcloud auth application-default login` "
                       "(or set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file)") from None
  return AuthorizedSession(credentials)


def _probe(session, base: str, bucket: str, prefix: str) -> None:
  """List the folder (a missing bucket: 404), then write and delete a probe object in it."""
  import socket
  from urllib.parse import quote
  timeout = _CHECK_TIMEOUT_S
  r = session.get(f"{base}/storage/v1/b/{quote(bucket)}/o", params={"maxResults": 1, "prefix": prefix},
                  timeout=timeout)
  if r.status_code == 404:
    raise _Refused(f"bucket gs://{bucket} does not exist; create it (`gcloud storage buckets create "
                   f"gs://{bucket}`) or name a bucket that exists")
  _refused(r, "list", bucket)
  name = f"{prefix}/.maskprior-write-check-{socket.gethostname()}-{os.getpid()}".lstrip("/")
  r = session.post(f"{base}/upload/storage/v1/b/{quote(bucket)}/o", params={"uploadType": "media", "name": name},
                   data=b"", timeout=timeout)
  _refused(r, "write to", bucket)
  session.delete(f"{base}/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}", timeout=timeout)


def _refused(r, what: str, bucket: str) -> None:
  if r.status_code in (401, 403):
    raise _Refused(f"the credentials found may not {what} gs://{bucket} (HTTP {r.status_code}: {_message(r)}); "
                   "grant them a role with storage.objects access there (e.g. roles/storage.objectUser), "
                   "or run with other credentials")
  if r.status_code >= 400:
    raise _Refused(f"Cloud Storage refused to {what} gs://{bucket} (HTTP {r.status_code}: {_message(r)})")


def _message(r) -> str:
  try:
    return str(r.json()["error"]["message"]).splitlines()[0][:120]
  except (ValueError, KeyError, TypeError):
    return (r.text or r.reason or "").splitlines()[0][:120] if (r.text or r.reason) else "no message"


def _cause(e: Exception) -> str:
  """The innermost cause of a connection error, in a few words ("Name or service not known",
  "Connection refused", "timed out")."""
  import re
  text = str(e)
  for pattern in (r"\[Errno -?\d+\] ([^'\")\]]+)", r"(Connection refused)", r"(timed out)", r"'error': '(\w+)'"):
    m = re.search(pattern, text)
    if m:
      return m.group(1).strip()
  return type(e).__name__
