// The data of a run: the data sets wb-train reads (--data, --data-path), the training pipeline's
// settings, and evaluation on the test split.
#pragma once

#include <cstdint>
#include <filesystem>

#include "trainer/config.hpp"
#include "trainer/data/dataset.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/parallel/communicator.hpp"

namespace wb::trainer {

// `split` of the data set --data names; synthetic data is written beside the run file `run`.
data::Dataset load_data(const TrainConfig& cfg, data::Split split, const std::filesystem::path& run);

// The training pipeline over `train_set` for `shard`, ending after `total_steps` batches.
data::PipelineConfig train_pipeline_config(const TrainConfig& cfg, const data::Dataset& train_set, const Shard& shard,
                                           std::int64_t total_steps);

struct Accuracy {
  float top1 = 0, top5 = 0;  // percent
  std::int64_t images = 0;
};
// `model` in eval mode on the test split, each rank on its shard, summed over `comm` (a collective).
Accuracy evaluate(const TrainConfig& cfg, model::ResNet50& model, parallel::Communicator& comm,
                  const std::filesystem::path& run);

}  // namespace wb::trainer
