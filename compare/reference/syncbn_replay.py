"""The replay of a wb-train --sync-bn step (SyncBatchNorm) for torch_step.py.

With --sync-bn, every batch norm of the step normalises with the statistics of its group's batches
(global: every rank; local: the ranks of one host), and its backward sums dy and dy * (x - mean) over
the group, as torch.nn.SyncBatchNorm does. A group's ranks together therefore compute exactly what one
process computes on their batches concatenated in rank order, with plain BatchNorm2d in train mode:
the same batch statistics, the same running-statistics update (the unbiased variance over the whole
group's count), and gradients of the group's mean loss equal to the mean of its ranks' gradients.
DistributedDataParallel then averages over all ranks: grad = sum over groups of |G| / W * grad(group).

So this replays each group as one concatenated batch, the chosen rank's group last (its running
statistics are what buffer_after shows), and records the chosen rank's rows of every activation and its
own loss (the mean over its rows), so the output has the keys and shapes of that rank's dump.
"""

import json


def groups_of(run, scope, ranks):
    """The rank groups of `scope` ('global' or 'local') among `ranks` (every rank of the job), in order."""
    if scope == "global":
        return [list(ranks)]
    # local: the ranks of one host (the run file's rank table), as MPI's shared-memory split makes them.
    hosts = dict(run._db.execute("SELECT rank, host FROM rank").fetchall())  # noqa: SLF001 (same package)
    groups = {}
    for r in ranks:
        groups.setdefault(hosts.get(r, ""), []).append(r)
    return sorted(groups.values())


def replay(*, model, optimizer, criterion, groups, rank, world, batch_of, load_buffers, progress, fault_hook=None,
           dumper_options=None):
    """Runs the step through the update; returns the chosen rank's loss and the dumper, whose end() is the
    caller's. batch_of(r) -> (inputs, labels) on the device, in the model's dtype; load_buffers(r) loads
    rank r's dumped buffers. dumper_options: keyword arguments of wbdump.StepDumper (out, metadata, sink;
    the metadata gains "wb.sync_bn_groups")."""
    import torch

    import wbdump

    class RowsDumper(wbdump.StepDumper):
        """Records rows [lo, hi) of every module output: one rank's part of a group's batch."""

        def __init__(self, *args, rows, **kwargs):
            super().__init__(*args, **kwargs)
            self._rows = rows

        def _make_hook(self, name):
            lo, hi = self._rows

            def hook(_module, _inputs, output):
                self._calls.append((name, wbdump._flatten_output(output[lo:hi])))  # noqa: SLF001
            return hook

    params = [p for _, p in model.named_parameters()]
    mine = next(g for g in groups if rank in g)
    total = [torch.zeros_like(p) for p in params]

    def group_step(group, dumper=None):
        batches = [batch_of(r) for r in group]
        inputs = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        load_buffers(rank if rank in group else group[0])  # a group's ranks hold the same running statistics
        optimizer.zero_grad(set_to_none=True)
        if dumper is not None:
            dumper.begin(*batch_of(rank))
        logits = model(inputs)
        n = batches[0][0].shape[0]
        losses = [criterion(logits[i * n:(i + 1) * n], batches[i][1]) for i in range(len(group))]
        own = losses[group.index(rank)] if rank in group else None
        if dumper is not None:
            dumper.loss(own)
        # The group's mean loss: the mean of its ranks' own losses.
        torch.stack(losses).mean().backward()
        with torch.no_grad():
            for t, p in zip(total, params):
                t += p.grad * (len(group) / world)
        progress(f"ranks {group}: losses " + ", ".join(f"{x.item():.9g}" for x in losses))
        return own

    for g in groups:
        if g is not mine:
            group_step(g)
    lo = mine.index(rank) * batch_of(rank)[0].shape[0]
    options = dict(dumper_options or {})
    options["metadata"] = dict(options.get("metadata") or {})
    options["metadata"]["wb.sync_bn_groups"] = json.dumps(groups)
    options.setdefault("source", "torch_step.py")
    dumper = RowsDumper(model, optimizer, rows=(lo, lo + batch_of(rank)[0].shape[0]), **options)
    loss = group_step(mine, dumper)
    with torch.no_grad():
        for t, p in zip(total, params):
            p.grad.copy_(t)
    if fault_hook is not None:
        fault_hook()
    optimizer.step()
    return loss, dumper
