#!/usr/bin/python3
"""A torch.save'd state dict (.pt/.pth) as a .safetensors reference for `wb compare`.

    torch_save_to_safetensors.py MODEL.pth --out REF.safetensors [--state before|after] [--key K]

Reads the file with Debian's PyTorch (torch.load on the CPU, weights only where this PyTorch can)
and writes every tensor under the dump keys of docs/ARCHITECTURE.md: a parameter NAME as
param.NAME (--state before: the state a step starts from) or param_after.NAME (--state after, the
default: a checkpoint saved after the step), a buffer (running_mean, running_var,
num_batches_tracked; MindSpore's moving_mean, moving_variance) as buffer.NAME or buffer_after.NAME. Accepted: a plain state dict
(torch.save(model.state_dict(), F)), a dict holding one under --key K or under "state_dict" or
"model" (a training checkpoint), or a whole pickled nn.Module. Names keep torchvision's spelling
(a "module." prefix from DataParallel is dropped). dtypes stay PyTorch's (int64 counters).

Bad input (no such file, not a torch.save file, no state dict in it, non-tensor values) prints one
line naming the file and what was expected, and exits 2.
"""

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

PROG = "torch_save_to_safetensors.py"
# torchvision's BatchNorm buffers, and MindSpore's names for the running statistics.
BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked", ".moving_mean", ".moving_variance")


class InputError(Exception):
    pass


def load_state_dict(path, key):
    import torch
    if not pathlib.Path(path).is_file():
        raise InputError(f"{path}: no such file (expected a torch.save'd state dict, .pt or .pth)")
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # a PyTorch without weights_only
            obj = torch.load(path, map_location="cpu")
        except Exception:  # a pickled module: only a full unpickling can read it (PyTorch 2.6+ asks explicitly)
            obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - every failure of torch.load is bad input here
        raise InputError(f"{path}: not a torch.save file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict) and key is not None:
        if key not in obj:
            raise InputError(f"{path}: no '{key}' in the saved dict (it holds {', '.join(map(str, list(obj)[:8]))})")
        obj = obj[key]
    elif isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        for candidate in ("state_dict", "model"):
            if isinstance(obj.get(candidate), dict):
                obj = obj[candidate]
                break
    if not isinstance(obj, dict) or not obj:
        raise InputError(f"{path}: holds a {type(obj).__name__}, expected a state dict (name -> tensor)")
    state = {}
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise InputError(f"{path}: '{name}' is a {type(value).__name__}, expected a tensor (use --key to pick "
                             "the state dict inside a checkpoint)")
        state[name[len("module."):] if name.startswith("module.") else name] = value
    return state


def convert(args):
    state = load_state_dict(args.model, args.key)
    suffix = "" if args.state == "before" else "_after"
    tensors = {}
    for name, value in state.items():
        kind = "buffer" if name.endswith(BUFFER_SUFFIXES) else "param"
        tensors[f"{kind}{suffix}.{name}"] = value.detach().cpu().contiguous().numpy()
    import wbformat
    try:
        wbformat.write_safetensors(args.out, tensors, metadata={"source": str(args.model), "state": args.state})
    except OSError as e:
        raise InputError(f"{args.out}: cannot write ({e.strerror})") from None
    print(f"{PROG}: wrote {args.out} ({len(tensors)} tensors, the state {args.state} the step)", file=sys.stderr)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description="A torch.save'd state dict as a wb compare reference.")
    parser.add_argument("model", help="the .pt/.pth file torch.save wrote")
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--state", choices=("before", "after"), default="after",
                        help="whether it holds the state before the step (param.*) or after it (param_after.*, default)")
    parser.add_argument("--key", help="the state dict's key inside a saved dict (default: state_dict or model)")
    args = parser.parse_args(argv)
    try:
        convert(args)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
