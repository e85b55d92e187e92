#pragma once
// ResNet-50 v1.5 (torchvision's resnet50) as data, in one place: its stages and bottleneck blocks, the
// modules in forward order with their kinds, the pipeline units, the convolutions' geometry, the
// parameters and buffers with their torchvision names and shapes, and the activations' shapes. The
// model (trainer/model/resnet50.cpp) builds itself from these tables; pipeline plans, SyncBatchNorm, the
// analyses, compare, ingest and the app look names up here instead of spelling or parsing them.
// Standard library only.
//
// Module ids are indices into modules(): conv1, bn1, relu, maxpool, then per block conv1, bn1, relu,
// conv2, bn2, conv3, bn3, [downsample.0, downsample.1,] the block itself (its residual sum and final
// relu), then avgpool, fc, loss and optimizer.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wb::layout {

inline constexpr int kStages = 4;
inline constexpr std::array<int, kStages> kBlocksPerStage{3, 4, 6, 3};
inline constexpr std::array<int, kStages> kStageWidth{64, 128, 256, 512};  // a block's inner width
inline constexpr int kExpansion = 4;                                       // a block's output: width * 4
inline constexpr int kStemWidth = 64;
inline constexpr int kBlocks = 16;
// Pipeline units, the smallest pieces a pipeline stage holds: 0 the stem (conv1 .. maxpool), 1..16 the
// blocks in order, 17 the tail (avgpool, fc, loss).
inline constexpr int kUnits = kBlocks + 2;
inline constexpr int kParamTensors = 161;

enum class ModuleKind : std::uint8_t { conv, batch_norm, relu, maxpool, block, avgpool, fc, loss, optimizer };

// A module's place inside its bottleneck block (none outside blocks).
enum class Part : std::uint8_t { none, conv1, bn1, relu, conv2, bn2, conv3, bn3, downsample_conv, downsample_bn, block };

struct Module {
  std::string name;  // torchvision's module name: "layer2.0.conv2", "layer2.0.downsample.1", "layer2.0"
  ModuleKind kind;
  int stage = -1;  // 0..3 inside layer1..layer4, -1 outside
  int block = -1;  // the block's index within its stage, -1 outside blocks
  int unit = -1;   // pipeline unit; -1 for the optimizer
  int conv = -1;   // index into convs() for a convolution
  Part part = Part::none;
};

// Every module, in forward order; a module's id is its index.
const std::vector<Module>& modules();
// The id of the module named `name`, or -1.
int module_id(std::string_view name);
int loss_module();
int optimizer_module();
bool is_batch_norm(int module);

// "layer<stage + 1>.<index>".
std::string block_name(int stage, int index);
// Where block b (0..15, in forward order) sits.
struct BlockPlace {
  int stage;
  int index;
};
BlockPlace block_place(int block);

// "head", "layer1.0" .. "layer4.2", "fc"; "" out of range.
std::string unit_name(int unit);
// The unit that holds module `name` (the stem's modules, a block and its modules, the tail's), or -1.
int unit_of_module(std::string_view name);

// A name of ResNet-50's shape read from text that comes from elsewhere (a user's dump, another
// framework's trace, a model with other widths): "layer<L>.<B>[.<rest>]" with L in 1..4.
struct BlockName {
  int stage;         // 0-based: layer1 is 0
  int index;         // block index within the stage
  std::string rest;  // what follows "layerL.B.", "" for the block itself
};
std::optional<BlockName> parse_block_name(std::string_view name);

// Where a torchvision-style name (a module, or a module's "weight", "bias", "running_mean",
// "running_var" or "num_batches_tracked"; hook names "layerL.B.relu.N" too) sits in ResNet-50's forward
// order, for ordering tensors that come from elsewhere (any block count, any width): increasing along
// the forward pass. std::nullopt for a name of another shape.
std::optional<std::int64_t> forward_rank(std::string_view name);

// The module whose range holds a dumped output: a block's relu is dumped per call ("layer1.0.relu.0",
// ".relu.1", ".relu.2"), and the range of module "layer1.0.relu" is the last call's (the residual add and
// its relu; the first two are fused into their batch norms). Other names are their own module.
std::string module_of_output(std::string_view dump_name);

// What a layer name from anywhere (ours, a PyTorch trace's module path) names, by its last component.
enum class NameKind : std::uint8_t { conv, batch_norm, relu, maxpool, avgpool, fc, block, loss, optimizer, other };
NameKind kind_of_name(std::string_view name);

// A convolution's geometry at width divisor 1 (the model's); divide in and out by width_div for the
// reduced models the tests use.
struct Conv {
  int module;
  std::int64_t in, out;
  int kernel, stride, pad;
};
const std::vector<Conv>& convs();

enum class ParamKind : std::uint8_t { conv_weight, bn_weight, bn_bias, fc_weight, fc_bias };

struct Param {
  std::string name;  // "layer2.0.conv2.weight"
  ParamKind kind;
  int module;
  std::vector<std::int64_t> shape;
};
// The 161 trainable tensors in forward order (torchvision's state_dict order), the classifier with
// `classes` rows, every width divided by width_div.
std::vector<Param> params(std::int64_t classes, int width_div = 1);

struct Buffer {
  std::string name;  // "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"
  int module;
  bool int64;        // num_batches_tracked: a 0-d int64
  std::vector<std::int64_t> shape;
};
// Every batch norm's buffers, in forward order.
std::vector<Buffer> buffers(int width_div = 1);

// The spatial size after `kernel`/`stride`/`pad`.
std::int64_t conv_out(std::int64_t size, int kernel, int stride, int pad);

// Each module's output shape for a batch of `batch` images of image x image (forward order; the
// optimizer, and the loss, which is a scalar, are left out), widths divided by width_div.
struct Activation {
  int module;
  std::vector<std::int64_t> shape;
};
std::vector<Activation> activations(std::int64_t batch, std::int64_t image, std::int64_t classes, int width_div = 1);

// The output shape of pipeline unit `unit` (0..kUnits-2) for batch n at image x image.
std::vector<std::int64_t> unit_output_shape(int unit, std::int64_t n, std::int64_t image);

}  // namespace wb::layout
