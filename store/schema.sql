-- wb run file, schema version 5 (store/migrate.hpp: what each version added, and the migration steps).
-- One file per run (or per rank before `wb merge`). Python's sqlite3 reads it with no extra package.
-- All times are integer nanoseconds on rank 0's clock: the recorder applies each rank's measured clock
-- offset before writing, and keeps the offsets in `rank` so drift can be checked.
-- Names are interned in `string` and referred to by id (name_id), like Nsight Systems' StringIds.
-- PRAGMA user_version and meta.schema_version both hold the version. A file of an older version opens
-- through the migration steps in store/migrate.cpp; a newer one is an error naming both versions.

-- Key/value metadata of the run.
--   schema_version  this schema's version ("5")
--   time_origin_ns  range_data.start_ns is relative to it (set before the first range is written)
--   created_utc     ISO-8601 UTC time the file was created
--   config_json     the trainer's resolved configuration, JSON
--   world_size      number of ranks in the job
--   rank            the rank that wrote a per-rank file (absent in merged files)
--   device          "cpu", "cuda:0", ...
--   device_total_memory  the GPU's memory in bytes (CUDA runs, and imported GPU traces)
--   compute_major   the GPU's compute capability major (CUDA runs, and imported GPU traces)
--   complete        "1" when the run finished cleanly, "0" while recording or after a crash/I/O error
--   dropped_events  events lost by the recorder (queue overflow or failed commits)
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

-- Every name (operator, kernel, track, parameter) stored once.
CREATE TABLE string (
  id   INTEGER PRIMARY KEY,  -- referred to by *.name_id
  text TEXT NOT NULL UNIQUE
);

-- One row per process of the job.
CREATE TABLE rank (
  rank                INTEGER PRIMARY KEY,  -- MPI rank, 0-based
  host                TEXT NOT NULL,        -- host name
  device              TEXT NOT NULL,        -- "cpu", "cuda:1", ...
  pid                 INTEGER NOT NULL,     -- process id
  clock_offset_ns     INTEGER NOT NULL,     -- add to this rank's clock to get rank 0's, measured at start
  clock_offset_end_ns INTEGER NOT NULL,     -- the same, measured at the end (drift = end - start)
  dropped_events      INTEGER NOT NULL      -- events this rank's recorder lost
);

-- A timeline lane: a host thread, a device stream, a data queue or a communicator.
CREATE TABLE track (
  id      INTEGER PRIMARY KEY,  -- unique within the file (remapped by wb merge)
  rank    INTEGER NOT NULL,     -- rank.rank
  kind    TEXT NOT NULL CHECK (kind IN ('thread', 'stream', 'queue', 'comm')),
  name_id INTEGER NOT NULL      -- string.id, e.g. "main", "data-worker-2", "stream 7", "batch queue"
);

-- Host ranges: every operator's forward/backward, loss, optimizer, data wait, copy, step.
-- Read and insert them through the view `range`, which has the columns files of versions 1-4 stored.
-- They are stored packed in range_data, keyed by (track, start): the key is the index a time window of
-- one track is read through, so there is no separate index, and a range costs about 24 bytes.
CREATE TABLE range_data (
  track_id INTEGER NOT NULL,  -- track.id (kind 'thread')
  start_ns INTEGER NOT NULL,  -- start - meta.time_origin_ns
  kind     INTEGER NOT NULL,  -- depth * 16 + category, + 4096 for each earlier range of equal key (below)
  dur_ns   INTEGER NOT NULL,  -- end - start
  name_id  INTEGER NOT NULL,  -- string.id: module name ("layer1.0.conv1") or phase name
  step     INTEGER NOT NULL,  -- training step, -1 outside a step
  corr_id  INTEGER NOT NULL,  -- correlation id shared with the kernels it launched, 0 = none
  -- Two ranges of one track with the same start, depth and category (possible only with a clock coarser
  -- than 1 ns, e.g. an imported trace's microseconds) are both kept, times unchanged: the later one's
  -- kind has 4096 added (kind >> 12 numbers them).
  PRIMARY KEY (track_id, start_ns, kind)
) WITHOUT ROWID;
CREATE VIEW range AS SELECT
  track_id,                                                                            -- track.id
  start_ns + (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns') AS start_ns,
  start_ns + dur_ns + (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns') AS end_ns,
  name_id,                                                                             -- string.id
  kind & 15 AS category,  -- 0 forward, 1 backward, 2 optimizer, 3 loss, 4 data, 5 h2d, 6 comm, 7 step
  (kind >> 4) & 255 AS depth,  -- nesting level on the track, 0 = outermost
  step,                   -- training step, -1 outside a step
  corr_id                 -- correlation id shared with the kernels it launched, 0 = none
FROM range_data;
CREATE TRIGGER range_insert INSTEAD OF INSERT ON range BEGIN
  INSERT INTO range_data(track_id, start_ns, kind, dur_ns, name_id, step, corr_id) VALUES (
    NEW.track_id, NEW.start_ns - (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns'),
    NEW.depth * 16 + NEW.category + 4096 * (SELECT count(*) FROM range_data WHERE track_id = NEW.track_id AND
      start_ns = NEW.start_ns - (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns') AND
      kind & 4095 = NEW.depth * 16 + NEW.category),
    NEW.end_ns - NEW.start_ns, NEW.name_id, NEW.step, NEW.corr_id);
END;

-- Device activity recorded by CUPTI (kernels, memcpys, memsets).
CREATE TABLE kernel (
  track_id INTEGER NOT NULL,  -- track.id (kind 'stream')
  start_ns INTEGER NOT NULL,
  end_ns   INTEGER NOT NULL,
  name_id  INTEGER NOT NULL,  -- string.id: kernel name, or "memcpy HtoD" etc.
  corr_id  INTEGER NOT NULL,  -- range.corr_id of the launching host range
  kind     INTEGER NOT NULL,  -- 0 kernel, 1 memcpy, 2 memset
  grid_x   INTEGER NOT NULL,  -- launch grid (0 for memcpy/memset)
  grid_y   INTEGER NOT NULL,
  grid_z   INTEGER NOT NULL,
  block_x  INTEGER NOT NULL,  -- block size (0 for memcpy/memset)
  block_y  INTEGER NOT NULL,
  block_z  INTEGER NOT NULL,
  bytes    INTEGER NOT NULL,  -- bytes copied or set, 0 for kernels
  blocks_per_sm REAL NOT NULL DEFAULT -1,  -- thread blocks per SM (grid blocks / SMs), -1 unknown
  occupancy     REAL NOT NULL DEFAULT -1,  -- estimated achieved occupancy 0..1, -1 unknown
  launch_ns     INTEGER NOT NULL DEFAULT -1,  -- start of the runtime call that launched it, -1 unknown
  launch_end_ns INTEGER NOT NULL DEFAULT -1   -- end of that call, -1 unknown
);
CREATE INDEX kernel_track_start ON kernel (track_id, start_ns);
CREATE INDEX kernel_corr ON kernel (corr_id);

-- Sampled values: the batch queue's depth at every push and pop. A GPU stream's launch queue (a queue
-- track named "<stream> launch queue") has no rows here: its depth follows from the stream's kernels
-- (+1 at each launch_ns, -1 at the kernel's start_ns), and the reader derives it; files imported before
-- that hold its samples here.
CREATE TABLE counter (
  track_id INTEGER NOT NULL,  -- track.id (kind 'queue')
  t_ns     INTEGER NOT NULL,
  value    REAL NOT NULL
);
CREATE INDEX counter_track_t ON counter (track_id, t_ns);

-- One gradient bucket's allreduce in one step on one rank.
CREATE TABLE allreduce (
  rank        INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  bucket      INTEGER NOT NULL,  -- 0 = the bucket holding the first parameters in forward order
  first_param INTEGER NOT NULL,  -- param.idx of the bucket's first parameter
  last_param  INTEGER NOT NULL,  -- param.idx of its last parameter (inclusive)
  bytes       INTEGER NOT NULL,  -- gradient bytes reduced
  ready_ns    INTEGER NOT NULL,  -- when the bucket's last gradient was produced
  start_ns    INTEGER NOT NULL,  -- when the collective started
  end_ns      INTEGER NOT NULL   -- when it completed
);
CREATE INDEX allreduce_rank_step ON allreduce (rank, step);

-- One training step on one rank.
CREATE TABLE step (
  rank            INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  start_ns        INTEGER NOT NULL,
  end_ns          INTEGER NOT NULL,
  data_wait_ns    INTEGER NOT NULL,  -- time blocked waiting for the next batch
  comm_exposed_ns INTEGER NOT NULL,  -- allreduce time not overlapped with backward
  loss            REAL NOT NULL,
  lr              REAL NOT NULL,
  images          INTEGER NOT NULL   -- images processed by this rank in the step
);
CREATE INDEX step_rank_step ON step (rank, step);

-- Trainable parameters in forward order (ResNet-50: 161 tensors).
CREATE TABLE param (
  idx    INTEGER PRIMARY KEY,  -- position in forward order, the index split points refer to
  name   TEXT NOT NULL,        -- torchvision name, e.g. "layer1.0.conv1.weight"
  shape  TEXT NOT NULL,        -- JSON array, e.g. "[64,3,7,7]"
  numel  INTEGER NOT NULL,
  bucket INTEGER NOT NULL,     -- allreduce bucket (allreduce.bucket); -1: in none (a --shard-fc slice)
  decay  INTEGER NOT NULL      -- 1 when weight decay applies
);

-- Dumped tensors (our own step dumps, source 'run'; imported references use other sources).
CREATE TABLE tensor (
  source     TEXT NOT NULL,     -- 'run' for this run's dumps
  step       INTEGER NOT NULL,
  rank       INTEGER NOT NULL,
  kind       TEXT NOT NULL,     -- input, label, param, buffer, act, loss, grad, param_after, buffer_after, momentum
  name       TEXT NOT NULL,     -- torchvision name ("conv1.weight", "layer1.0.conv1"); empty for input/label/loss
  exec_order INTEGER NOT NULL,  -- order the tensor was produced in the step
  dtype      TEXT NOT NULL,     -- safetensors spelling: 'F32', 'F64', 'F16', 'BF16', 'I32', 'I64', 'U8', 'BOOL'
  shape      TEXT NOT NULL,     -- JSON array, e.g. "[8,3,32,32]"
  data       BLOB NOT NULL      -- little-endian, C order
);
CREATE INDEX tensor_source_name ON tensor (source, name);

-- Saved results of `wb compare`.
CREATE TABLE comparison (
  id               INTEGER PRIMARY KEY,
  created_utc      TEXT NOT NULL,
  a_path           TEXT NOT NULL,     -- the compared side
  b_path           TEXT NOT NULL,     -- the reference side
  profile          TEXT NOT NULL,     -- verdict profile, e.g. 'migration-fp32'
  passed           INTEGER NOT NULL,  -- tensors that passed
  failed           INTEGER NOT NULL,  -- tensors that failed
  first_divergence TEXT NOT NULL,     -- JSON {name, kind, reason}, '' when none
  json             TEXT NOT NULL      -- the full report, JSON
);

-- One compared tensor of a saved comparison.
CREATE TABLE comparison_row (
  comparison_id INTEGER NOT NULL,  -- comparison.id
  exec_order    INTEGER NOT NULL,
  name          TEXT NOT NULL,
  kind          TEXT NOT NULL,
  status        TEXT NOT NULL,     -- 'pass', 'fail', 'missing_a', 'missing_b', 'shape_mismatch', ...
  metrics_json  TEXT NOT NULL      -- the metrics, JSON
);
CREATE INDEX comparison_row_id ON comparison_row (comparison_id, exec_order);

-- One evaluation of the model (wb-train --eval): top-1/top-5 accuracy over the held-out images of every
-- rank, recorded by rank 0. Run files written before this table existed have none (readers check).
CREATE TABLE evaluation (
  step    INTEGER NOT NULL,  -- training steps done before the evaluation
  top1    REAL NOT NULL,     -- percent
  top5    REAL NOT NULL,     -- percent
  images  INTEGER NOT NULL,  -- images evaluated, all ranks together
  seconds REAL NOT NULL      -- wall time of the evaluation
);

-- Pipeline parallelism (wb-train --pipeline-stages S --micro-batches M; meta pipeline_json holds the
-- plan: stages, micro-batches, schedule, loss, each stage's units). Empty in other runs, and absent
-- from files written before pipelines were recorded.
-- One micro-batch's forward or backward on one stage, or one message between neighbouring stages.
CREATE TABLE pipeline_span (
  rank     INTEGER NOT NULL,
  step     INTEGER NOT NULL,
  stage    INTEGER NOT NULL,
  micro    INTEGER NOT NULL,  -- micro-batch index within the step, from 0
  kind     TEXT NOT NULL,     -- forward, backward, send_act, recv_act, send_grad, recv_grad
  peer     INTEGER NOT NULL,  -- the other rank of a message; -1 for forward and backward
  bytes    INTEGER NOT NULL,  -- the message's size; 0 for forward and backward
  post_ns  INTEGER NOT NULL,  -- message posted (non-blocking send or receive); start_ns for compute
  start_ns INTEGER NOT NULL,  -- compute began; a receive: the stage began waiting for it; a send: post_ns
  end_ns   INTEGER NOT NULL   -- compute ended; a receive: the data was there; a send: seen complete
);

-- One step of one stage: the forward-backward phase (from the step's first pipeline activity to its
-- gradients ready for the update), its busy time and its idle time by cause. The bubble is
-- wait_act_ns + wait_grad_ns.
CREATE TABLE pipeline_step (
  rank              INTEGER NOT NULL,
  step              INTEGER NOT NULL,
  stage             INTEGER NOT NULL,
  replica           INTEGER NOT NULL,  -- data-parallel replica (rank = replica * stages + stage)
  start_ns          INTEGER NOT NULL,
  end_ns            INTEGER NOT NULL,
  busy_ns           INTEGER NOT NULL,  -- the micro-batches' forward and backward, messages staged included
  wait_act_ns       INTEGER NOT NULL,  -- waiting for the previous stage's activations
  wait_grad_ns      INTEGER NOT NULL,  -- waiting for the next stage's gradients
  wait_allreduce_ns INTEGER NOT NULL   -- waiting for the stage's gradient allreduce over its replicas
);

-- Triggered capture (wb-train --capture slow:K|signal|steps:A-B): the windows of steps whose events
-- (range, kernel, counter and allreduce rows) were kept. The step table holds every step whatever was
-- captured; events of steps outside every window, and of no step (step -1), are not in the file.
-- Empty for a full recording, and absent from files written before triggered capture (readers check).
CREATE TABLE capture_window (
  rank         INTEGER NOT NULL,
  first_step   INTEGER NOT NULL,  -- the window's first step
  last_step    INTEGER NOT NULL,  -- its last step (inclusive)
  trigger      TEXT NOT NULL,     -- slow (a step over K x the running median), signal (SIGUSR1), steps (steps:A-B)
  trigger_step INTEGER NOT NULL,  -- the step that triggered it: the slow step, the step SIGUSR1 arrived in, A
  detail       TEXT NOT NULL      -- in words: the slow step's time against the median, other triggers merged in
);

-- Memory (wb-train records it unless --no-memory-profile; a PyTorch import stores what its trace has):
-- every allocation and free of the backend's storage on one rank, with the rank's total after it. The
-- CPU backend keeps its tensors from one step to the next, so after the first step it allocates
-- nothing and live_bytes stays at what it holds; the CUDA caching allocator reports each block handed
-- out and returned to its cache. Absent from files written before memory was recorded.
CREATE TABLE memory (
  rank       INTEGER NOT NULL,
  t_ns       INTEGER NOT NULL,
  step       INTEGER NOT NULL,  -- training step, -1 outside a step (building the model)
  bytes      INTEGER NOT NULL,  -- > 0 allocated, < 0 freed: what the allocator holds for it (rounding included)
  live_bytes INTEGER NOT NULL,  -- the rank's memory held after this event
  role       INTEGER NOT NULL,  -- 0 activation, 1 gradient, 2 parameter, 3 momentum, 4 workspace, 5 data, 6 other
  name_id    INTEGER NOT NULL   -- string.id: the module whose op allocated it ("layer1.0.conv1", "loss"), or the
                                --   buffer ("parameters", "gradients", "momentum", "batch") or op of another tool
);

-- The communicator's calibration (wb-train --calibrate-comm, on by default in data-parallel runs), per
-- rank, each measurement after a barrier so no rank's lateness is in it: kind allreduce (bytes = message
-- size, the collective alone), compute (bytes 0: a 3x3 64-channel convolution's forward and backwards,
-- alone), compute_during_allreduce (that convolution while a second thread runs back-to-back allreduces
-- of `bytes`) and allreduce_during_compute (those allreduces). The split model predicts from these
-- rows. Absent from files written before the calibration (schema version 4).
CREATE TABLE comm_calibration (
  rank      INTEGER NOT NULL,
  kind      TEXT NOT NULL,
  bytes     INTEGER NOT NULL,
  reps      INTEGER NOT NULL,  -- measurements taken
  median_ns INTEGER NOT NULL,
  min_ns    INTEGER NOT NULL
);

-- Trial runs of allreduce splits (wb tune-split RUN writes them into RUN): each candidate trained for a
-- few steps with the run's own configuration, candidates alternated round by round. Absent from files
-- written before schema version 4.
CREATE TABLE split_trial (
  round             INTEGER NOT NULL,  -- 0-based; every candidate runs once per round
  candidate         TEXT NOT NULL,     -- "current", "model best", "single bucket", ...
  split             TEXT NOT NULL,     -- as --allreduce-split takes it ("none": one bucket)
  steps             INTEGER NOT NULL,  -- steps measured (after the warmup steps)
  median_step_ns    INTEGER NOT NULL,  -- median over the measured steps and ranks; -1 when the trial failed
  predicted_step_ns INTEGER NOT NULL,  -- the model's prediction before the trial; -1 for none
  alpha_beta_ns     INTEGER NOT NULL,  -- the alpha-beta fit's prediction, for comparison; -1 for none
  exit_code         INTEGER NOT NULL,
  run               TEXT NOT NULL,     -- the trial's own run file, or "" when it was not kept
  utc               TEXT NOT NULL      -- ISO-8601 time the trial ended
);
