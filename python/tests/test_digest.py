"""eplb-dev64 (eplb/digest.py): the known answers pinned in tests/common/text_bytes_test.cpp, from the
plain-Python reference, the torch ops and the extension's C++ loop; chunking changes nothing."""
import pytest
import torch

from eplb import digest

KNOWN = [(b"", 0x0), (b"abc", 0xB1F9597D70F30D6A), (bytes(range(256)), 0x3A837ACDEFD578D5)]


@pytest.mark.parametrize("data,known", KNOWN)
def test_known_answers_on_every_path(data, known):
    row = torch.tensor(list(data), dtype=torch.uint8).reshape(1, len(data))
    assert digest.reference_digest(data) == known
    assert digest.digest_rows_with_torch(row) == [known]
    assert digest.digest_rows(row) == [known]  # the C++ loop on the CPU
    assert digest.digest_rows_with_torch(row.repeat(3, 1)) == [known] * 3


def test_chunks_and_odd_lengths_give_the_reference(monkeypatch):
    rows = torch.randint(0, 256, (3, 1021), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    expected = [digest.reference_digest(bytes(row.tolist())) for row in rows]
    assert digest.digest_rows(rows) == expected
    monkeypatch.setattr(digest, "_CHUNK_WORDS", 7)  # many chunks, the last one partial
    assert digest.digest_rows_with_torch(rows) == expected
    assert digest.digest_selected(rows, [2, 0]) == [expected[2], expected[0]]
