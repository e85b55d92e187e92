#!/usr/bin/python3
"""Evidence for the migration-fp32 verdict thresholds (compare/verdict.cpp).

Runs one ResNet-50 training step (batch 32, 32x32 input, SGD momentum 0.9, weight decay 1e-4) several
ways and prints, per tensor kind, the worst rel-L2 and cosine between each fp32 variant and a float64
reference of the same step:
  fp32            torch's default CPU kernels (oneDNN convolutions)
  fp32-nomkldnn   torch's native convolutions: a second correct fp32 implementation, the situation of
                  our trainer against PyTorch
and, to show the thresholds still catch real faults, three planted ones:
  bn-eps          BatchNorm eps 1e-5 -> 1e-4 (a classic migration mistake)
  no-wd           SGD without weight decay
  momentum-conv   MindSpore-style BN momentum (0.9 instead of 0.1) for the running statistics
"momentum_minus_grad" is the momentum buffer minus the gradient: after step one, weight decay times the
starting weights, which isolates the optimizer from the (noisy) gradients.
Usage: /usr/bin/python3 bench/compare_thresholds.py [--batch 32] [--size 32] [--seed 0]
"""
import argparse
import math

import torch
import torchvision


def run_step(dtype, batch, size, mkldnn=True, bn_eps=1e-5, weight_decay=1e-4, bn_momentum=0.1, seed=0):
    torch.backends.mkldnn.enabled = mkldnn
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(num_classes=10)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps = bn_eps
            m.momentum = bn_momentum
    model = model.to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, 3, size, size, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 10, (batch,), generator=g)
    out = {"input": x.detach().clone()}
    for n, p in model.named_parameters():
        out["param." + n] = p.detach().clone()
    hooks = []
    for name, mod in model.named_modules():
        if name and not isinstance(mod, torchvision.models.resnet.Bottleneck) and len(list(mod.children())) == 0:
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, name=name: out.__setitem__("act." + name, o.detach().clone())))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=weight_decay)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    out["loss"] = loss.detach().clone()
    loss.backward()
    for n, p in model.named_parameters():
        out["grad." + n] = p.grad.detach().clone()
    opt.step()
    for n, p in model.named_parameters():
        out["param_after." + n] = p.detach().clone()
        out["momentum." + n] = opt.state[p]["momentum_buffer"].detach().clone()
        # The optimizer's own contribution, free of the gradient's noise (wb compares it for momentum).
        out["momentum_minus_grad." + n] = out["momentum." + n] - out["grad." + n]
    for n, b in model.named_buffers():
        if "num_batches" not in n:
            out["buffer_after." + n] = b.detach().clone()
    for h in hooks:
        h.remove()
    return out


def rel_l2(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    nb = b.norm().item()
    nd = (a - b).norm().item()
    return 0.0 if nd == 0 else (math.inf if nb == 0 else nd / nb)


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    na, nb = a.norm().item(), b.norm().item()
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return math.nan
    return max(-1.0, min(1.0, (a @ b).item() / (na * nb)))


def summarise(label, cand, ref):
    kinds = {}
    for k, b in ref.items():
        if k not in cand:
            continue
        # 1-D tensors (BatchNorm affine parameters, biases) apart: their gradients are sums over the
        # batch with heavy cancellation, far noisier than convolution weights'.
        kind = k.split(".")[0] + ("[1-D]" if b.dim() == 1 and k != "input" else "")
        r = rel_l2(cand[k], b)
        c = cosine(cand[k], b)
        d = abs(cand[k].double() - b.double()).max().item()
        worst = kinds.setdefault(kind, [0.0, "", 1.0, 0.0])
        if r > worst[0]:
            worst[0], worst[1] = r, k
        worst[2] = min(worst[2], c)
        worst[3] = max(worst[3], d)
    print(f"== {label}")
    for kind, (r, k, c, d) in kinds.items():
        print(f"  {kind:18s} max rel-L2 {r:9.3e} ({k})  min cosine {c:.9f}  max |d| {d:9.3e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    b, s, seed = args.batch, args.size, args.seed
    ref = run_step(torch.float64, b, s, seed=seed)
    summarise("fp32 vs fp64", run_step(torch.float32, b, s, seed=seed), ref)
    summarise("fp32-nomkldnn vs fp64", run_step(torch.float32, b, s, mkldnn=False, seed=seed), ref)
    base32 = run_step(torch.float32, b, s, seed=seed)
    summarise("fp32 vs fp32-nomkldnn", run_step(torch.float32, b, s, mkldnn=False, seed=seed), base32)
    summarise("fault bn-eps vs fp32", run_step(torch.float32, b, s, bn_eps=1e-4, seed=seed), base32)
    summarise("fault no-wd vs fp32", run_step(torch.float32, b, s, weight_decay=0.0, seed=seed), base32)
    summarise("fault momentum-conv vs fp32", run_step(torch.float32, b, s, bn_momentum=0.9, seed=seed), base32)


if __name__ == "__main__":
    main()
