// The data of a run: the data sets wb-train reads (--data, --data-path), the training pipeline's
// settings, and evaluation on the test split.
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "trainer/config.hpp"
#include "trainer/data/dataset.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/parallel/communicator.hpp"

namespace wb::trainer {

// `split` of the data set --data names; synthetic data is written beside the run file `run`.
data::Dataset load_data(const TrainConfig& cfg, data::Split split, const std::filesystem::path& run);

// Image folders: the recipe's settings for --image-size S (Resize side round(S * 256 / 224)).
data::ImageTransformConfig image_transform_config(const TrainConfig& cfg, data::ImageRecipe recipe);

// The training pipeline over `train_set` for `shard`, ending after `total_steps` batches.
data::PipelineConfig train_pipeline_config(const TrainConfig& cfg, const data::Dataset& train_set, const Shard& shard,
                                           std::int64_t total_steps);

// Image folders: which files batch `step` of `pipeline` holds and the geometry each got (recipe, crop,
// flip), found again the way the workers found them, for the PyTorch baseline to preprocess the same
// files with torchvision (meta "dump_input.rank<R>" of a step dump).
nlohmann::json describe_image_batch(const data::Dataset& set, const data::Pipeline& pipeline, std::int64_t step);

struct Accuracy {
  float top1 = 0, top5 = 0;  // percent
  std::int64_t images = 0;
};
// `model` in eval mode on the test split, each rank on its shard, summed over `comm` (a collective).
Accuracy evaluate(const TrainConfig& cfg, model::ResNet50& model, parallel::Communicator& comm,
                  const std::filesystem::path& run);

}  // namespace wb::trainer
