"""`maskprior_jax.checkpoint.Checkpointer` on its own: a saved step restored as it was, an
unreadable newest step set aside for the one before it, a failed save reported once as an
OSError naming the folder."""
import errno

import chex
import jax
import jax.numpy as jnp
import pytest

from maskprior_jax.checkpoint import Checkpointer


def _state(x: float) -> dict:
  return {"params": {"w": jnp.full((3, 2), x, jnp.float32)}, "mask": jnp.arange(4, dtype=jnp.float32) * x}


def test_the_newest_readable_step_comes_back_as_saved(tmp_path, caplog):
  ck = Checkpointer(tmp_path / "ck", max_to_keep=3)
  for step in (1, 2):
    ck.save(step, _state(float(step)), {"step": step, "history": [{"step": step}]}, wait=True)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _state(0.0))
  state, record = ck.restore_latest(abstract)
  chex.assert_trees_all_equal(state, _state(2.0))
  assert record == {"step": 2, "history": [{"step": 2}]}
  # The newest step damaged (its state's files cut): set aside with a warning, the one before returned.
  for f in (tmp_path / "ck" / "2").rglob("*"):
    if f.is_file() and f.suffix != ".json" and "record" not in str(f):
      f.write_bytes(b"")
  with caplog.at_level("WARNING", logger="maskprior_jax.checkpoint"):
    state, record = ck.restore_latest(abstract)
  chex.assert_trees_all_equal(state, _state(1.0))
  assert record["step"] == 1
  assert (tmp_path / "ck" / "unreadable_2").is_dir() and "unreadable" in caplog.text
  ck.close()


def test_a_failed_save_is_one_oserror_naming_the_folder(tmp_path, monkeypatch):
  """orbax reports a full disk from its save thread as a ValueError; the checkpointer raises it
  once as OSError(ENOSPC) naming the folder, and later waits and close() stay quiet."""
  ck = Checkpointer(tmp_path / "ck")
  def full(*a, **k):
    raise ValueError("[Errno 28] No space left on device: 'tmp'")
  monkeypatch.setattr(ck.manager, "wait_until_finished", full)
  with pytest.raises(OSError) as e:
    ck.wait()
  assert e.value.errno == errno.ENOSPC and str(tmp_path / "ck") in str(e.value)
  assert "checkpoint save failed" in str(e.value)
  ck.wait()   # reported already
  monkeypatch.setattr(ck.manager, "close", full)
  ck.close()


def test_a_save_that_fails_at_once_names_the_folder(tmp_path, monkeypatch):
  ck = Checkpointer(tmp_path / "ck")
  monkeypatch.setattr(ck.manager, "save", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
  with pytest.raises(OSError, match="checkpoint save failed") as e:
    ck.save(1, _state(1.0), {"step": 1})
  assert e.value.errno == errno.EACCES and str(tmp_path / "ck") in str(e.value)
