#include "trainer/pipeline_plan.hpp"

#include <sstream>

#include <nlohmann/json.hpp>

#include "trainer/model/resnet50.hpp"

namespace wb::trainer {
namespace {

using model::ResNet50;

// The unit a split name begins: "layer3" is layer3.0; -1 when unknown.
int unit_of(const std::string& name) {
  for (int u = 1; u < ResNet50::kUnits; ++u) {
    const std::string n = ResNet50::unit_name(u);
    if (n == name || (n.ends_with(".0") && n.substr(0, n.size() - 2) == name)) return u;
  }
  return -1;
}

std::string plural(int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

}  // namespace

std::vector<int> parse_stage_split(const std::string& text, int stages) {
  std::vector<int> first{0};
  if (text.empty()) {
    if (stages == 2) {
      first.push_back(unit_of("layer3"));  // the seed's split
    } else {
      for (int s = 1; s < stages; ++s) first.push_back(s * ResNet50::kUnits / stages);
    }
  } else {
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
      const int u = unit_of(item);
      if (u < 0) {
        throw ConfigError("--stage-split " + text + ": unknown split layer '" + item +
                          "'; expected layer1..layer4, a block such as layer3.2, or fc");
      }
      if (u <= first.back()) {
        throw ConfigError("--stage-split " + text + ": '" + item + "' does not come after the previous stage's start; " +
                          "expected units in forward order");
      }
      first.push_back(u);
    }
    if (!text.empty() && text.back() == ',') throw ConfigError("--stage-split " + text + ": empty item after the last comma");
    if (static_cast<int>(first.size()) != stages) {
      throw ConfigError("--stage-split " + text + ": " + plural(static_cast<int>(first.size()) - 1, "split point") +
                        " for " + plural(stages, "stage") + "; expected " + std::to_string(stages - 1));
    }
  }
  first.push_back(ResNet50::kUnits);
  return first;
}

void validate_pipeline_flags(const TrainConfig& c) {
  const int S = c.pipeline_stages, M = c.micro_batches;
  if (S < 1 || S > ResNet50::kUnits) {
    throw ConfigError("--pipeline-stages " + std::to_string(S) + ": expected 1.." + std::to_string(ResNet50::kUnits) +
                      " (ResNet-50 has " + std::to_string(ResNet50::kUnits) + " units to share out)");
  }
  if (M < 1) throw ConfigError("--micro-batches " + std::to_string(M) + ": expected at least 1");
  if (M < S) {
    throw ConfigError("--micro-batches " + std::to_string(M) + ": fewer micro-batches than the " + std::to_string(S) +
                      " pipeline stages (expected M >= S, so that every stage has work in flight)");
  }
  if (c.batch_size > 0 && c.batch_size % M != 0) {
    throw ConfigError("--batch-size " + std::to_string(c.batch_size) + ": not divisible by --micro-batches " +
                      std::to_string(M) + " (every micro-batch has the same size)");
  }
  if (c.pipeline_schedule != "gpipe" && c.pipeline_schedule != "1f1b") {
    throw ConfigError("--pipeline-schedule: expected gpipe or 1f1b, got '" + c.pipeline_schedule + "'");
  }
  if (c.pipeline_loss != "sum" && c.pipeline_loss != "mean") {
    throw ConfigError("--pipeline-loss: expected sum or mean, got '" + c.pipeline_loss + "'");
  }
  if (S == 1 && !c.stage_split.empty()) {
    throw ConfigError("--stage-split " + c.stage_split + ": one pipeline stage has nothing to split (add --pipeline-stages)");
  }
  parse_stage_split(c.stage_split, S);
  if (c.nproc > 0 && c.nproc % S != 0) {
    throw ConfigError("--pipeline-stages " + std::to_string(S) + ": --nproc " + std::to_string(c.nproc) +
                      " is not a multiple of it (world = stages x data-parallel replicas)");
  }
  if (S > 1 || M > 1) {
    if (c.dump_all_ranks || c.dump_ranks != "0") {
      throw ConfigError("--dump-ranks " + (c.dump_all_ranks ? std::string("all") : c.dump_ranks) +
                        ": a pipeline run's dump gathers every stage's tensors on rank 0 (drop it)");
    }
    if (c.eval) {
      throw ConfigError("--eval: the evaluation runs the whole model on one batch size and is not available with "
                        "pipeline stages or micro-batches (drop it)");
    }
    if (c.check_sync) {
      throw ConfigError("--check-sync: checks data-parallel replicas of the whole model; pipeline stages hold different "
                        "parameters (drop it)");
    }
  }
}

PipelinePlan plan_pipeline(const TrainConfig& c, int world) {
  validate_pipeline_flags(c);
  PipelinePlan p;
  p.stages = c.pipeline_stages;
  p.micro_batches = c.micro_batches;
  if (world % p.stages != 0) {
    throw ConfigError("--pipeline-stages " + std::to_string(p.stages) + ": the job's " + plural(world, "rank") +
                      " are not a multiple of it (world = stages x data-parallel replicas)");
  }
  p.replicas = world / p.stages;
  p.micro_batch_size = c.batch_size / p.micro_batches;
  p.first_unit = parse_stage_split(c.stage_split, p.stages);
  p.one_f_one_b = c.pipeline_schedule == "1f1b";
  p.loss_mean = c.pipeline_loss == "mean";
  return p;
}

StageSeat seat_of(const PipelinePlan& plan, int rank) {
  StageSeat s;
  s.stage = rank % plan.stages;
  s.replica = rank / plan.stages;
  if (s.stage > 0) s.prev_rank = rank - 1;
  if (s.stage + 1 < plan.stages) s.next_rank = rank + 1;
  return s;
}

std::string describe_stages(const PipelinePlan& plan) {
  std::string out;
  for (int s = 0; s < plan.stages; ++s) {
    if (s) out += " | ";
    const int a = plan.first_unit[static_cast<std::size_t>(s)], b = plan.first_unit[static_cast<std::size_t>(s) + 1];
    out += ResNet50::unit_name(a);
    if (b - 1 > a) out += ".." + ResNet50::unit_name(b - 1);
  }
  return out;
}

std::string describe_pipeline(const PipelinePlan& plan) {
  return plural(plan.stages, "stage") + " x " + plural(plan.replicas, "replica") + ", " +
         std::to_string(plan.micro_batches) + (plan.micro_batches == 1 ? " micro-batch" : " micro-batches") + " of " +
         std::to_string(plan.micro_batch_size) + ", " + (plan.one_f_one_b ? "1f1b" : "gpipe") + ", loss " +
         (plan.loss_mean ? "mean" : "sum") + ": " + describe_stages(plan);
}

std::string pipeline_json(const PipelinePlan& plan) {
  nlohmann::json j;
  j["stages"] = plan.stages;
  j["replicas"] = plan.replicas;
  j["micro_batches"] = plan.micro_batches;
  j["micro_batch_size"] = plan.micro_batch_size;
  j["schedule"] = plan.one_f_one_b ? "1f1b" : "gpipe";
  j["loss"] = plan.loss_mean ? "mean" : "sum";
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < plan.stages; ++s) {
    const int a = plan.first_unit[static_cast<std::size_t>(s)], b = plan.first_unit[static_cast<std::size_t>(s) + 1];
    stages.push_back({{"first_unit", a}, {"end_unit", b}, {"first", ResNet50::unit_name(a)}, {"last", ResNet50::unit_name(b - 1)}});
  }
  j["stage_units"] = stages;
  return j.dump();
}

}  // namespace wb::trainer
