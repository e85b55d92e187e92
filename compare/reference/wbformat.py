"""Tensor formats shared by torch_step.py and wbdump.py, in plain Python + numpy.

- safetensors: read_safetensors / write_safetensors. The layout is a u64 little-endian header length
  N, N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
  "__metadata__": {str: str}}, then the data, little-endian and C-order, with offsets relative to
  the start of the data. The header is padded with spaces to a multiple of 8 so the data stay
  aligned. No safetensors package is needed (and Debian does not ship one).
- run files: RunFile opens a wb run file (SQLite, store/schema.sql) read-only with the standard
  sqlite3 module and returns its configuration, parameter table and dumped tensors.

Every malformed input raises FormatError, whose message names the file and what was expected.
"""

import json
import math
import os
import pathlib
import sqlite3
import struct

import numpy as np

# Schema versions of store/schema.sql this reader understands.
SUPPORTED_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)  # 5 packs ranges, which this reader does not read

# The reference implementation refuses larger headers; so do we, to fail fast on garbage.
MAX_HEADER_BYTES = 100 * 1000 * 1000

# safetensors dtype name -> little-endian numpy dtype. BF16 has no numpy dtype: it is carried as
# its raw 16-bit pattern (uint16) and widened to float32 on request (see bf16_to_f32).
_NUMPY_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# numpy dtype (native, by kind + size) -> safetensors name, for arrays written without an explicit dtype.
_NAME_OF = {
    ("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16",
    ("i", 8): "I64", ("i", 4): "I32", ("i", 2): "I16", ("i", 1): "I8",
    ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16", ("u", 1): "U8",
    ("b", 1): "BOOL",
}


class FormatError(Exception):
    """A file that is not what it should be. str(error) is one line naming the file."""

    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")
        self.path = str(path)
        self.what = what


def numpy_dtype(name, path="<tensor>"):
    """The numpy dtype that holds a tensor of safetensors dtype `name` (BF16 -> uint16 bits)."""
    try:
        return _NUMPY_OF[name]
    except KeyError:
        raise FormatError(path, f"unsupported dtype '{name}' (expected one of {', '.join(_NUMPY_OF)})") from None


def dtype_name(array):
    """The safetensors name of a numpy array's dtype."""
    key = (array.dtype.kind, array.dtype.itemsize)
    if key not in _NAME_OF:
        raise ValueError(f"numpy dtype {array.dtype} has no safetensors equivalent")
    return _NAME_OF[key]


def bf16_to_f32(bits):
    """Widen BF16 bit patterns (uint16) to float32 exactly (BF16 is the top half of an F32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def dump_key(kind, name):
    """The dump key of a tensor: 'input', 'label', 'loss', or '<kind>.<name>' (e.g. 'act.layer1.0').
    wb-train names its batch and loss rows after their kind (kind 'input', name 'input'); an empty name
    means the same."""
    if kind in ("input", "label", "loss") and name in ("", kind):
        return kind
    return f"{kind}.{name}"


# --------------------------------------------------------------------------------------------- safetensors

def write_safetensors(path, tensors, metadata=None, dtypes=None):
    """Write `tensors` (an ordered mapping name -> numpy array) to `path`, in that order.

    `dtypes` optionally maps a name to its safetensors dtype where the array's own dtype does not say
    it (BF16 stored as uint16 bits). `metadata` values must be strings.
    """
    dtypes = dtypes or {}
    header = {}
    blobs = []
    offset = 0
    for name, array in tensors.items():
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved and cannot name a tensor")
        array = np.asarray(array)
        st_dtype = dtypes.get(name) or dtype_name(array)
        # Convert to the little-endian layout the format prescribes, C-order, no strides.
        data = np.asarray(array, dtype=numpy_dtype(st_dtype), order="C").tobytes()  # keeps 0-d arrays 0-d
        header[name] = {"dtype": st_dtype, "shape": [int(d) for d in array.shape],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"safetensors metadata must map str to str (got {key!r}: {type(value).__name__})")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    # Write beside the target and rename, so a reader never sees half a file.
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    os.replace(tmp, path)


def read_safetensors_header(path):
    """(header dict without __metadata__, metadata dict, data start offset) of a .safetensors file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise FormatError(path, f"not a safetensors file (only {size} bytes, expected an 8-byte header length)")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or n + 8 > size:
                raise FormatError(path, f"not a safetensors file (header length {n} does not fit the "
                                        f"{size}-byte file or exceeds {MAX_HEADER_BYTES} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise FormatError(path, f"cannot read safetensors file ({e.strerror})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(path, f"safetensors header is not UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise FormatError(path, "safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(path, "safetensors __metadata__ must map strings to strings")
    return header, metadata, 8 + n


def read_safetensors(path, widen_bf16=False):
    """(dict name -> numpy array in data order, metadata dict). BF16 stays uint16 bits unless
    widen_bf16, which returns float32 instead."""
    header, metadata, start = read_safetensors_header(path)
    size = os.path.getsize(path)
    entries = []
    for name, info in header.items():
        try:
            st_dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            shape = [int(d) for d in shape]
        except (KeyError, TypeError, ValueError):
            raise FormatError(path, f"tensor '{name}' needs dtype, shape and data_offsets [begin, end]") from None
        dt = numpy_dtype(st_dtype, path)
        expected = math.prod(shape) * dt.itemsize
        if not (0 <= begin <= end and end - begin == expected and start + end <= size):
            raise FormatError(path, f"tensor '{name}' has data_offsets [{begin}, {end}], expected a range of "
                                    f"{expected} bytes for {st_dtype}{shape} inside the {size - start}-byte data")
        entries.append((begin, end, name, st_dtype, dt, shape))
    entries.sort()
    covered = 0
    for begin, end, name, *_ in entries:
        if begin != covered:
            raise FormatError(path, f"tensor '{name}' starts at byte {begin} of the data, expected {covered} "
                                    "(tensors must cover the data without gaps or overlaps)")
        covered = end
    tensors = {}
    with open(path, "rb") as f:
        for begin, end, name, st_dtype, dt, shape in entries:
            f.seek(start + begin)
            array = np.frombuffer(f.read(end - begin), dtype=dt).reshape(shape)
            if st_dtype == "BF16" and widen_bf16:
                array = bf16_to_f32(array)
            tensors[name] = array
    return tensors, metadata


# --------------------------------------------------------------------------------------------- run files

class RunTensor:
    """One row of the run file's tensor table, decoded."""

    __slots__ = ("kind", "name", "exec_order", "dtype", "array")

    def __init__(self, kind, name, exec_order, dtype, array):
        self.kind, self.name, self.exec_order, self.dtype, self.array = kind, name, exec_order, dtype, array

    @property
    def key(self):
        return dump_key(self.kind, self.name)


class RunFile:
    """A wb run file opened read-only. Raises FormatError when `path` is not one."""

    def __init__(self, path):
        self.path = str(path)
        p = pathlib.Path(path)
        if not p.is_file():
            raise FormatError(path, "no such run file (expected a .sqlite file written by wb-train)")
        with open(p, "rb") as f:
            magic = f.read(16)
        if magic != b"SQLite format 3\x00":
            raise FormatError(path, "not a wb run file (expected an SQLite database written by wb-train)")
        # mode=ro: a reference run must never modify the file it reads.
        self._db = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise FormatError(path, f"not a wb run file (SQLite says: {e})") from None
        missing = sorted({"meta", "tensor", "param"} - tables)
        if missing:
            raise FormatError(path, f"not a wb run file (no {', '.join(missing)} table; expected the schema "
                                    "of store/schema.sql)")
        self.meta = dict(self._db.execute("SELECT key, value FROM meta"))
        version = self.meta.get("schema_version")
        if version is None or not version.isdigit():
            raise FormatError(path, "not a wb run file (its meta table has no integer schema_version)")
        if int(version) not in SUPPORTED_SCHEMA_VERSIONS:
            raise FormatError(path, f"run file schema version {version} is not supported (this reader knows "
                                    f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))})")
        self._tables = tables

    def close(self):
        self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def config(self):
        """The trainer's resolved configuration (meta config_json) as a dict."""
        text = self.meta.get("config_json")
        if text is None:
            raise FormatError(self.path, "run file has no meta config_json (expected the trainer's configuration)")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise FormatError(self.path, f"meta config_json is not JSON ({e})") from None
        if not isinstance(config, dict):
            raise FormatError(self.path, "meta config_json is not a JSON object")
        return config

    def world_size(self):
        text = self.meta.get("world_size", "1")
        if not text.isdigit() or int(text) < 1:
            raise FormatError(self.path, f"meta world_size is '{text}', expected a positive integer")
        return int(text)

    def params(self):
        """[(idx, name, shape list, decay bool)] in forward order from the param table."""
        rows = self._db.execute("SELECT idx, name, shape, decay FROM param ORDER BY idx").fetchall()
        return [(idx, name, json.loads(shape), bool(decay)) for idx, name, shape, decay in rows]

    def dumped_steps(self, rank):
        """Steps with dumped tensors (source 'run') on `rank`, ascending."""
        rows = self._db.execute("SELECT DISTINCT step FROM tensor WHERE source = 'run' AND rank = ? ORDER BY step",
                                (rank,))
        return [r[0] for r in rows]

    def dumped_ranks(self):
        return [r[0] for r in self._db.execute("SELECT DISTINCT rank FROM tensor WHERE source = 'run' ORDER BY rank")]

    def step_lr(self, step, rank):
        """The lr recorded in the step table for (rank, step), or None."""
        if "step" not in self._tables:
            return None
        row = self._db.execute("SELECT lr FROM step WHERE rank = ? AND step = ?", (rank, step)).fetchone()
        return None if row is None else float(row[0])

    def steps_before(self, step, rank):
        """How many steps the step table records on `rank` before `step` (0 when it has none)."""
        if "step" not in self._tables:
            return 0
        return self._db.execute("SELECT COUNT(*) FROM step WHERE rank = ? AND step < ?", (rank, step)).fetchone()[0]

    def tensors(self, step, rank, kinds=None):
        """[RunTensor] dumped at (step, rank), source 'run', in exec_order; optionally only `kinds`."""
        sql = ("SELECT kind, name, exec_order, dtype, shape, data FROM tensor "
               "WHERE source = 'run' AND step = ? AND rank = ?")
        args = [step, rank]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        out = []
        for kind, name, order, st_dtype, shape_text, blob in self._db.execute(sql + " ORDER BY exec_order", args):
            key = dump_key(kind, name)
            try:
                shape = [int(d) for d in json.loads(shape_text)]
            except (json.JSONDecodeError, TypeError, ValueError):
                raise FormatError(self.path, f"tensor '{key}' has shape '{shape_text}', expected a JSON array") from None
            dt = numpy_dtype(st_dtype, self.path)
            expected = math.prod(shape) * dt.itemsize
            if len(blob) != expected:
                raise FormatError(self.path, f"tensor '{key}' has {len(blob)} bytes of data, expected {expected} "
                                             f"for {st_dtype}{shape}")
            out.append(RunTensor(kind, name, order, st_dtype, np.frombuffer(blob, dtype=dt).reshape(shape)))
        return out
