#include "trainer/input.hpp"

#include <algorithm>
#include <vector>

#include "trainer/data/sampler.hpp"

namespace wb::trainer {
namespace fs = std::filesystem;

data::Dataset load_data(const TrainConfig& cfg, data::Split split, const fs::path& run) {
  data::DatasetKind kind = data::parse_dataset_kind(cfg.data);
  fs::path path = cfg.data_path;
  data::SyntheticOptions syn;
  syn.seed = cfg.seed;
  syn.train_images = cfg.synthetic_samples;
  syn.test_images = std::max<int64_t>(cfg.batch_size, cfg.synthetic_samples / 5);
  if (kind == data::DatasetKind::kImageFolder) {
    // The split is the folder: --data-path for training, --val-path for evaluation.
    const std::string& folder = split == data::Split::kTrain ? cfg.data_path : cfg.val_path;
    if (folder.empty()) throw ConfigError(split == data::Split::kTrain ? "--data imagefolder: give --data-path ROOT"
                                                                       : "--data imagefolder: give --val-path ROOT");
    return data::load_dataset(kind, folder, split);
  }
  if (path.empty()) {
    if (kind == data::DatasetKind::kFashionMnist) path = "/usr/share/datasets/fashion-mnist";
    else if (kind == data::DatasetKind::kSynthetic) path = fs::path(run).replace_extension("") += "-synthetic-data";
    else throw ConfigError("--data cifar10: give --data-path (the cifar-10-batches-bin folder)");
  }
  return data::load_dataset(kind, path, split, syn);
}

data::ImageTransformConfig image_transform_config(const TrainConfig& cfg, data::ImageRecipe recipe) {
  data::ImageTransformConfig ic;
  ic.recipe = recipe;
  ic.image_size = cfg.image_size;
  ic.resize_size = data::resize_side_for(cfg.image_size);
  ic.flip_prob = cfg.random_flip ? 0.5 : 0.0;
  return ic;
}

data::PipelineConfig train_pipeline_config(const TrainConfig& cfg, const data::Dataset& train_set, const Shard& shard,
                                           std::int64_t total_steps) {
  data::PipelineConfig pc;
  pc.batch_size = cfg.batch_size;
  pc.workers = cfg.data_workers;
  pc.prefetch = cfg.prefetch;
  pc.num_shards = shard.count;
  pc.shard_id = shard.rank;
  pc.seed = cfg.seed;
  pc.delay_us = cfg.data_delay_us;
  pc.transform.image_size = cfg.image_size;
  pc.transform.crop_padding = cfg.crop_padding;
  pc.transform.flip_prob = cfg.random_flip ? 0.5 : 0.0;
  pc.transform.norm = data::default_normalization(train_set.kind);
  pc.total_steps = total_steps;
  pc.image = image_transform_config(cfg, data::parse_image_recipe(cfg.transforms));
  pc.skip_bad_images = cfg.skip_bad_images;
  return pc;
}

nlohmann::json describe_image_batch(const data::Dataset& set, const data::Pipeline& pipeline, std::int64_t step) {
  const data::PipelineConfig& pc = pipeline.config();
  const data::ShardSampler& sampler = pipeline.sampler();
  const std::int64_t epoch = step / sampler.steps_per_epoch();
  std::vector<std::int64_t> perm;
  sampler.fill_epoch_order(epoch, perm);
  data::ImageSampleLoader loader(pc.image);
  std::vector<float> scratch(static_cast<std::size_t>(3) * pc.image.image_size * pc.image.image_size);
  nlohmann::json samples = nlohmann::json::array();
  const std::int64_t n = set.size();
  for (int j = 0; j < pc.batch_size; ++j) {
    std::int64_t index = sampler.sample_index(perm, step % sampler.steps_per_epoch(), j);
    for (std::int64_t tries = 0;; ++tries) {
      const std::string& rel = set.files[static_cast<std::size_t>(index)];
      try {
        const data::ImageAug a = loader.load(set.root / rel, (set.root / rel).string(), pc.seed, epoch, index,
                                             scratch.data());
        samples.push_back({{"file", rel}, {"label", set.labels[static_cast<std::size_t>(index)]}, {"index", index},
                           {"flip", a.flip}, {"resize", {a.resize_h, a.resize_w}},
                           {"crop", {a.top, a.left, a.height, a.width}}});
        break;
      } catch (const data::DataError&) {
        if (!pc.skip_bad_images || tries + 1 >= n) throw;
        index = (index + 1) % n;  // as the pipeline: the next readable image in dataset order
      }
    }
  }
  return {{"root", fs::absolute(set.root).string()}, {"recipe", std::string(data::recipe_name(pc.image.recipe))},
          {"image_size", pc.image.image_size}, {"resize_size", pc.image.resize_size}, {"step", step},
          {"samples", samples}};
}

Accuracy evaluate(const TrainConfig& cfg, model::ResNet50& model, parallel::Communicator& comm, const fs::path& run) {
  const int rank = comm.rank();
  data::Dataset test = load_data(cfg, data::Split::kTest, run);
  data::PipelineConfig pc;
  pc.batch_size = cfg.batch_size;
  pc.workers = cfg.data_workers;
  pc.prefetch = cfg.prefetch;
  pc.num_shards = comm.size();
  pc.shard_id = rank;
  pc.seed = cfg.seed;
  pc.shuffle = false;
  pc.transform.image_size = cfg.image_size;
  pc.transform.train = false;
  pc.transform.norm = data::default_normalization(data::parse_dataset_kind(cfg.data));
  pc.image = image_transform_config(cfg, data::ImageRecipe::kTorchvisionEval);
  pc.skip_bad_images = cfg.skip_bad_images;
  pc.total_steps = data::ShardSampler(test.size(), comm.size(), rank, cfg.batch_size, cfg.seed, false).steps_per_epoch();
  data::Pipeline eval_pipe(test, pc);
  model.set_training(false);
  model.set_observer(nullptr);
  std::int64_t top1 = 0, top5 = 0, seen = 0;
  const int k = cfg.num_classes;
  while (data::BatchRef b = eval_pipe.pop()) {
    model.forward(b->images, b->labels);
    std::vector<float> logits = model.logits_to_host();
    for (int i = 0; i < cfg.batch_size; ++i) {
      const float* row = logits.data() + static_cast<std::size_t>(i) * k;
      int label = b->labels[static_cast<std::size_t>(i)];
      int higher = 0;
      for (int c = 0; c < k; ++c) higher += row[c] > row[label];
      top1 += higher == 0;
      top5 += higher < 5;
      ++seen;
    }
  }
  model.set_training(true);
  std::vector<std::int64_t> all = comm.allgather(std::vector<std::int64_t>{top1, top5, seen});
  std::int64_t t1 = 0, t5 = 0, n = 0;
  for (std::size_t r = 0; r < all.size(); r += 3) {
    t1 += all[r];
    t5 += all[r + 1];
    n += all[r + 2];
  }
  return {n ? 100.0f * t1 / n : 0.0f, n ? 100.0f * t5 / n : 0.0f, n};
}

}  // namespace wb::trainer
