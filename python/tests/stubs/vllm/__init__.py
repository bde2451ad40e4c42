"""Test stub of vLLM (see ../README.md): not vLLM."""
