"""The vision benchmark: a ViT classifier over a patch grid with a 2-D locality prior."""
