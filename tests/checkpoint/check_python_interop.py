#!/usr/bin/env python3
"""dtrain's safetensors files and Hugging Face's `safetensors` package agree.

    check_python_interop.py INTEROP_BINARY

Runs with the Python of the pinned torch wheel (scripts/setup installs
`safetensors` there). Exits 77 (CTest's skip) when `torch` or `safetensors`
cannot be imported.

1. INTEROP_BINARY write A: safetensors.torch.load_file(A) gives the expected
   tensors (dtypes, shapes, values) and safe_open(A).metadata() the metadata.
2. safetensors.torch.save_file(...) writes B: INTEROP_BINARY read B prints the
   same tensors and metadata.
"""

import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as error:
    print("check_python_interop: SKIP: %s (pip install safetensors into the torch venv; scripts/setup does)" % error)
    sys.exit(77)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64,
          "i64": torch.int64, "i32": torch.int32, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}
CPP_NAMES = {torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float64: "Double",
             torch.int64: "Long", torch.int32: "Int", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool"}


def values(dtype):
    """The same values as safetensors_interop.cpp's values()."""
    steps = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    if dtype == torch.bool:
        return steps.remainder(2).to(dtype)
    if dtype == torch.uint8:
        return (steps * 40).to(dtype)
    return ((steps - 2) * 1.5).to(dtype)


def expected():
    tensors = {"t." + name: values(dtype) for name, dtype in DTYPES.items()}
    tensors["scalar"] = torch.tensor(3.25)
    tensors["empty"] = torch.zeros(0, 2)
    return tensors


def fail(message):
    print("check_python_interop: FAIL: " + message)
    sys.exit(1)


def main():
    binary = sys.argv[1]
    want = expected()
    with tempfile.TemporaryDirectory() as folder:
        # dtrain writes, Python reads.
        written = os.path.join(folder, "dtrain.safetensors")
        subprocess.run([binary, "write", written], check=True)
        got = load_file(written)
        if sorted(got) != sorted(want):
            fail("names: %s, expected %s" % (sorted(got), sorted(want)))
        for name, tensor in want.items():
            if got[name].dtype != tensor.dtype or got[name].shape != tensor.shape or not torch.equal(got[name], tensor):
                fail("%s: Python read %s %s %s, expected %s %s %s" % (name, got[name].dtype, tuple(got[name].shape),
                     got[name].tolist(), tensor.dtype, tuple(tensor.shape), tensor.tolist()))
        with safe_open(written, framework="pt") as opened:
            metadata = opened.metadata()
        if metadata != {"format": "pt", "written_by": "dtrain"}:
            fail("metadata read by Python: %s" % metadata)
        print("check_python_interop: Python read dtrain's %d tensors and metadata" % len(want))

        # Python writes, dtrain reads.
        from_python = os.path.join(folder, "python.safetensors")
        save_file(want, from_python, metadata={"written_by": "python"})
        result = subprocess.run([binary, "read", from_python], check=True, stdout=subprocess.PIPE)
        printed = json.loads(result.stdout)
        if printed["metadata"] != {"written_by": "python"}:
            fail("metadata read by dtrain: %s" % printed["metadata"])
        seen = {t["name"]: t for t in printed["tensors"]}
        if sorted(seen) != sorted(want):
            fail("dtrain read names %s, expected %s" % (sorted(seen), sorted(want)))
        for name, tensor in want.items():
            t = seen[name]
            values_read = t["values"]
            if (t["dtype"] != CPP_NAMES[tensor.dtype] or t["shape"] != list(tensor.shape)
                    or values_read != tensor.double().flatten().tolist()):
                fail("%s: dtrain read %s %s %s, expected %s %s %s" % (name, t["dtype"], t["shape"], values_read,
                     CPP_NAMES[tensor.dtype], list(tensor.shape), tensor.double().flatten().tolist()))
        print("check_python_interop: dtrain read Python's %d tensors and metadata" % len(want))


if __name__ == "__main__":
    main()
