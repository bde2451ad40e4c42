"""Input and output conversion for the eplb package (private).

Contract: inputs may be torch tensors (any device; any integer or floating
dtype, bfloat16 and float16 included), numpy arrays (any integer or
floating dtype) or nested lists. `loads()` makes them C-contiguous float64
numpy arrays and `indices()` C-contiguous int64 ones, as eplb._eplb wants;
anything else (bool, complex, strings, ragged lists, None) raises
eplb.Error naming the argument. `output()` returns results in the caller's
kind: torch in gives a CPU torch tensor out, numpy or a list gives numpy.
torch is never imported here: a value can only be a tensor if the caller
has imported torch already, so `import eplb` stays fast without torch.
"""
import math
import operator
import sys

import numpy as np

from eplb.errors import Error

_INT64_MAX = np.iinfo(np.int64).max


def _torch():
    return sys.modules.get("torch")


def is_tensor(value) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _numpy_of(name: str, value) -> np.ndarray:
    if is_tensor(value):
        torch = _torch()
        if value.dtype == torch.bool or value.is_complex():
            raise Error(f"{name} must hold integers or floats, got a {value.dtype} tensor")
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16 or value.dtype == torch.float16:
            value = value.to(torch.float64)
        return value.contiguous().numpy()
    if isinstance(value, np.ndarray):
        return value
    if value is None or isinstance(value, (str, bytes, dict, set)):
        raise Error(f"{name} must be a torch tensor, a numpy array or a nested list, not {type(value).__name__}")
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as failure:
        raise Error(f"{name} is not a rectangular array of numbers: {failure}") from None


def loads(name: str, value) -> np.ndarray:
    """A load matrix or window as a C-contiguous float64 array (values are checked in C++)."""
    array = _numpy_of(name, value)
    if array.dtype.kind not in "iuf":
        raise Error(f"{name} must hold integers or floats, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float64)


def policy_loads(name: str, value) -> np.ndarray:
    """loads() for the policy call, except that float32 (torch's usual dtype) stays float32: the
    binding widens it once, straight into its own buffer (no float64 copy here)."""
    array = _numpy_of(name, value)
    if array.dtype == np.float32:
        return np.ascontiguousarray(array)
    if array.dtype.kind not in "iuf":
        raise Error(f"{name} must hold integers or floats, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float64)


def indices(name: str, value) -> np.ndarray:
    """An index array (phy2log) as a C-contiguous int64 array (ranges are checked in C++)."""
    array = _numpy_of(name, value)
    if array.size == 0:
        raise Error(f"{name} is empty (shape {array.shape})")
    if array.dtype.kind not in "iu":
        raise Error(f"{name} must hold integers, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.max() > _INT64_MAX:
        raise Error(f"{name} holds {array.max()}, beyond int64")
    return np.ascontiguousarray(array, dtype=np.int64)


def dtype_of(value):
    """The dtype of an integer array argument (torch or numpy), or None for lists."""
    if is_tensor(value) or isinstance(value, np.ndarray):
        return value.dtype
    return None


def output(array: np.ndarray, like, dtype=None):
    """`array` as the caller's kind (torch if `like` is a tensor), in `dtype` if given."""
    if is_tensor(like):
        tensor = _torch().from_numpy(array)
        return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def count(name: str, value, minimum: int = 1, maximum: int = 1 << 30) -> int:
    """A whole number argument in [minimum, maximum] (Python or numpy integer, not bool)."""
    if isinstance(value, bool):
        raise Error(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise Error(f"{name} must be an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise Error(f"{name} must be in [{minimum}, {maximum}], got {number}")
    return number


def real(name: str, value, minimum: float = 0.0) -> float:
    """A finite real argument >= minimum."""
    if isinstance(value, bool):
        raise Error(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Error(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(number) and number >= minimum):
        raise Error(f"{name} must be finite and >= {minimum}, got {value!r}")
    return number
