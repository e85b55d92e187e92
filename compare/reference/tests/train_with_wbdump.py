"""A small user training script that dumps its first step with wbdump (used by test_wbdump.py).

    train_with_wbdump.py --seed S --out STEP.safetensors [--steps N]

Trains torchvision's ResNet-50 (the seeded model and batch of fixtures.py) with the seed guide's
optimizer set-up (SGD, momentum, weight decay on conv/fc weights only) and PyTorch's
CrossEntropyLoss with label smoothing; the only lines for the dump are the four marked `wbdump`.
"""

import argparse

import torch

import fixtures
import wbdump


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    model = fixtures.make_model(args.seed).train()
    decay = [p for n, p in model.named_parameters() if fixtures.decays(n, list(p.shape))]
    rest = [p for n, p in model.named_parameters() if not fixtures.decays(n, list(p.shape))]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}],
                                lr=args.lr, momentum=0.9, nesterov=True)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    for step in range(1, args.steps + 1):
        x, y = fixtures.make_batch(args.seed + step - 1)
        inputs, labels = torch.from_numpy(x), torch.from_numpy(y).long()
        dumper = wbdump.StepDumper(model, optimizer, out=args.out, step=step) if step == 1 else None  # wbdump
        if dumper:
            dumper.begin(inputs, labels)                                                                # wbdump
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        if dumper:
            dumper.loss(loss)                                                                           # wbdump
        loss.backward()
        optimizer.step()
        if dumper:
            dumper.end()                                                                                # wbdump
        print(f"step {step}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
