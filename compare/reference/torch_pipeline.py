"""PyTorch's side of a pipeline-parallel wb-train step (--pipeline-stages S --micro-batches M).

A pipeline step is, numerically, the whole model run over the mini-batch's M micro-batches one at a
time: BatchNorm normalises each micro-batch with its own statistics and updates its running
statistics once per micro-batch, in micro-batch order; each micro-batch's loss is the usual mean
over its images; the step's loss is their sum (--pipeline-loss sum, the seed's PipelineCell) or
their mean (mean), and the gradients are those of that loss, accumulated micro-batch by micro-batch.
How the stages split the model does not enter the numbers, so it is not replayed.

torch_step.py imports this module: `settings` reads the run's pipeline configuration (None for
runs without one) and `step` runs the micro-batches.
"""

PIPELINE_LOSSES = ("sum", "mean")


def settings(config, path, error):
    """The pipeline of a run's config_json, validated; None when the run has none. `error` is the
    exception class raised for bad input (its message names the file)."""
    def whole(key):
        value = config.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise error(f"{path}: config_json {key} is {value!r}, expected a whole number >= 1")
        return value

    stages, micro = whole("pipeline_stages"), whole("micro_batches")
    if stages == 1 and micro == 1:
        return None
    loss = config.get("pipeline_loss", "sum")
    if loss not in PIPELINE_LOSSES:
        raise error(f"{path}: config_json pipeline_loss is {loss!r}, expected one of {', '.join(PIPELINE_LOSSES)}")
    return {"stages": stages, "micro_batches": micro, "loss": loss,
            "schedule": config.get("pipeline_schedule", "gpipe")}


def check_batch(pipe, batch, path, error):
    if batch % pipe["micro_batches"] != 0:
        raise error(f"{path}: the dumped batch of {batch} images does not divide into {pipe['micro_batches']} "
                    "micro-batches")


def describe(pipe):
    return (f"pipeline: {pipe['stages']} stage(s), {pipe['micro_batches']} micro-batches run one at a time, "
            f"loss = {pipe['loss']} of the micro-batch losses")


def step(model, criterion, inputs, labels, pipe):
    """Forward and backward of every micro-batch in order, gradients accumulated into .grad (which
    the caller has zeroed); returns the step's loss, detached."""
    micro = pipe["micro_batches"]
    scale = 1.0 / micro if pipe["loss"] == "mean" else 1.0
    total = None
    for x, y in zip(inputs.chunk(micro), labels.chunk(micro)):
        loss = criterion(model(x), y) * scale
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total
