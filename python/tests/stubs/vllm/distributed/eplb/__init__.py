"""Test stub of vllm.distributed.eplb (see ../../../README.md)."""
