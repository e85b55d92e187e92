"""wbformat: safetensors written byte by byte as the format prescribes (checked by parsing the bytes
here by hand), read back exactly for every dtype, 0-d and empty tensors and BF16; malformed files
rejected with a FormatError naming the file; run files read with their tensors decoded.

Usage: test_wbformat.py [--tmp DIR]
"""

import json
import struct
import sys

import numpy as np

import fixtures
from fixtures import check
import wbformat


def sample_tensors(rng):
    return {
        "f64": rng.standard_normal((2, 3)),
        "f32": rng.standard_normal((4, 1, 3)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "i64": rng.integers(-2**62, 2**62, size=(3,), dtype=np.int64),
        "i32": rng.integers(-2**31, 2**31 - 1, size=(2, 2), dtype=np.int32),
        "i16": np.array([-32768, 7, 32767], dtype=np.int16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.arange(7, dtype=np.uint8),
        "bool": np.array([[True, False, True]]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
    }


def roundtrip(tmp):
    rng = np.random.default_rng(3)
    tensors = sample_tensors(rng)
    # BF16 bit patterns of values exactly representable in BF16.
    bf16_values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bf16_bits = (bf16_values.view(np.uint32) >> 16).astype(np.uint16)
    tensors["bf16"] = bf16_bits
    path = tmp / "all.safetensors"
    meta = {"wb.source": "test", "note": "ünïcode"}
    wbformat.write_safetensors(path, tensors, meta, dtypes={"bf16": "BF16"})

    # Parse the bytes by hand: u64 LE header length, JSON header, data in the written order.
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    check(n % 8 == 0, f"header length {n} is not a multiple of 8")
    stripped = raw[8:8 + n].rstrip(b" ")
    check(n - len(stripped) < 8, f"header padded by {n - len(stripped)} spaces, expected fewer than 8")
    header = json.loads(stripped.decode("utf-8"))
    check(header.pop("__metadata__") == meta, "metadata")
    data = raw[8 + n:]
    expect_dtype = {"f64": "F64", "f32": "F32", "f16": "F16", "i64": "I64", "i32": "I32", "i16": "I16",
                    "i8": "I8", "u8": "U8", "bool": "BOOL", "scalar": "F32", "empty": "F32", "big_endian": "I32",
                    "bf16": "BF16"}
    offset = 0
    for name, array in tensors.items():
        info = header[name]
        check(info["dtype"] == expect_dtype[name], f"{name} dtype {info['dtype']}")
        check(info["shape"] == list(array.shape), f"{name} shape {info['shape']}")
        begin, end = info["data_offsets"]
        check(begin == offset, f"{name} begins at {begin}, expected {offset}")
        le = array.astype(array.dtype.newbyteorder("<"))
        check(data[begin:end] == le.tobytes(), f"{name} bytes are not little-endian C-order")
        offset = end
    check(offset == len(data), "data size")

    back, back_meta = wbformat.read_safetensors(path)
    check(back_meta == meta and list(back) == list(tensors), "read keys and metadata")
    for name, array in tensors.items():
        check(back[name].shape == array.shape and np.array_equal(back[name], array), f"{name} values")
    check(back["scalar"].ndim == 0 and back["empty"].shape == (0, 4), "0-d and empty shapes")
    widened, _ = wbformat.read_safetensors(path, widen_bf16=True)
    check(widened["bf16"].dtype == np.float32 and np.array_equal(widened["bf16"], bf16_values), "BF16 widening")
    print(f"  round trip: {len(tensors)} tensors, {len(raw)} bytes, header {n} bytes: ok")


def malformed(tmp):
    good = tmp / "good.safetensors"
    wbformat.write_safetensors(good, {"a": np.arange(4, dtype=np.float32), "b": np.ones(2, dtype=np.int64)})
    raw = good.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])

    def with_header(h, extra=b""):
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + raw[8 + n:] + extra

    cases = {  # name: (content, what the message must say)
        "empty_file": (b"", "expected an 8-byte header length"),
        "truncated_data": (raw[:-3], "inside the"),
        "huge_header": (struct.pack("<Q", 200 * 1000 * 1000) + b"{}", "exceeds 100000000 bytes"),
        "not_json": (struct.pack("<Q", 8) + b"{{{{{{{{" + raw[8 + n:], "not UTF-8 JSON"),
        "overlap": (with_header(dict(header, b=dict(header["b"], data_offsets=[8, 24]))), "without gaps or overlaps"),
        "gap": (with_header(dict(header, b=dict(header["b"], data_offsets=[20, 36])), extra=b"\0" * 4),
                "without gaps or overlaps"),
        "wrong_size": (with_header(dict(header, a=dict(header["a"], shape=[5]))), "expected a range of 20 bytes"),
        "bad_dtype": (with_header(dict(header, a=dict(header["a"], dtype="F8_E4M3"))), "unsupported dtype 'F8_E4M3'"),
        "bad_metadata": (with_header(dict(header, __metadata__={"k": 1})), "must map strings to strings"),
    }
    for name, (content, phrase) in cases.items():
        path = tmp / f"{name}.safetensors"
        path.write_bytes(content)
        try:
            wbformat.read_safetensors(path)
            check(False, f"{name}: read without error")
        except wbformat.FormatError as e:
            check(str(e).startswith(str(path) + ": ") and phrase in str(e), f"{name}: unexpected message: {e}")
    print(f"  malformed safetensors: {len(cases)} files rejected with FormatError naming the file")


def run_file(tmp):
    path = tmp / "run.sqlite"
    config = {"num_classes": 10, "lr": 0.2, "momentum": 0.9, "weight_decay": 1e-4}
    db = fixtures.create_run(path, config, world_size=4)
    loss0d = np.array(2.25, dtype=np.float32)
    loss1 = np.array([2.5], dtype=np.float32)
    fixtures.insert_tensor(db, "loss", "", loss0d, step=1, rank=0, order=5)
    fixtures.insert_tensor(db, "act", "layer1.0", np.arange(6, dtype=np.float32).reshape(1, 2, 3), step=1, rank=0,
                           order=2)
    fixtures.insert_tensor(db, "loss", "loss", loss1, step=2, rank=3, order=0)  # wb-train names it so
    db.execute("INSERT INTO param(idx, name, shape, numel, bucket, decay) VALUES (0, 'conv1.weight', '[2,3]', 6, 0, 1)")
    db.execute("INSERT INTO step(rank, step, start_ns, end_ns, data_wait_ns, comm_exposed_ns, loss, lr, images) "
               "VALUES (0, 1, 0, 1, 0, 0, 2.25, 0.125, 4)")
    db.commit()
    db.close()
    with wbformat.RunFile(path) as run:
        check(run.config() == config and run.world_size() == 4, "config and world size")
        check(run.dumped_ranks() == [0, 3] and run.dumped_steps(0) == [1] and run.dumped_steps(3) == [2], "dumps")
        check(run.step_lr(1, 0) == 0.125 and run.step_lr(2, 0) is None, "step lr")
        check(run.steps_before(2, 0) == 1 and run.steps_before(1, 0) == 0, "steps before")
        check(run.params() == [(0, "conv1.weight", [2, 3], True)], "param table")
        ts = run.tensors(1, 0)
        check([t.key for t in ts] == ["act.layer1.0", "loss"], f"tensor keys {[t.key for t in ts]}")
        check(np.array_equal(ts[0].array, np.arange(6, dtype=np.float32).reshape(1, 2, 3)), "act values")
        check(ts[1].array.shape == () and float(ts[1].array) == 2.25, "0-d loss")
        (l3,) = run.tensors(2, 3, kinds=("loss",))
        check(l3.array.shape == (1,) and float(l3.array[0]) == 2.5 and l3.key == "loss", "[1] loss named 'loss'")
        check(run.tensors(1, 0, kinds=("grad",)) == [], "kind filter")
    print("  run file: config, world size, param table, step lr, dumped tensors ([] and [1] losses): ok")


def main():
    tmp = fixtures.tmp_dir_from_argv()
    roundtrip(tmp)
    malformed(tmp)
    run_file(tmp)
    print("test_wbformat: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except fixtures.CheckFailed as e:
        print(f"test_wbformat: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
