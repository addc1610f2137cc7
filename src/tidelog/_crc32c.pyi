"""Types of tidelog's native CRC-32C pass, built from ``src/tidelog/native/crc32c.c``
(``tidelog.log.crcs`` is its one user; the C file's comment has the contract)."""

from array import array
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

_Data: TypeAlias = Buffer | npt.NDArray[Any]  # numpy's arrays are Buffers from Python 3.12
_Int64s: TypeAlias = npt.NDArray[np.int64] | array[int]

def crc32c_ranges(
    data: _Data,
    starts: _Int64s,
    ends: _Int64s,
    out: npt.NDArray[np.uint32],
    /,
    *,
    portable: bool = False,
) -> None: ...
def stamp_record_crcs(
    data: _Data, positions: _Int64s, sizes: _Int64s, /, *, portable: bool = False
) -> None: ...
def check_records(
    data: _Data,
    positions: _Int64s,
    sizes: _Int64s,
    offsets: npt.NDArray[np.int64],
    timestamps: npt.NDArray[np.int64],
    /,
    *,
    portable: bool = False,
) -> tuple[int, int]: ...
def hardware() -> bool: ...
