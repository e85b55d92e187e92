// Pairing the tensors of A with those of the reference B.
//
// In order: (1) exact pairs from the mapping file, (2) A's name rewritten by the mapping file's regex
// rules, (3) the exact name, (4) automatic matching of what is left by execution order and shape.
//
// Mapping file (JSON):
//   {
//     "pairs": {"param.fc.w": "param.fc.weight", ...},           // A key -> B key
//     "rules": [{"pattern": "\\.gamma$", "replace": ".weight"},  // ECMAScript regex, $1 groups;
//               ...],                                             // applied in order, each to the
//                                                                 // result of the previous one
//     "thresholds": [{"match": "^act\\.layer4\\.", "rel_l2_max": 2e-3}, ...],  // regex on either key
//     "auto": true                                                // order+shape matching (default)
//   }
//
// TroubleShooter's weight map (ts.migrator.get_weight_map's JSON, [{PyTorch name: MindSpore name},
// {value conversions}]) is a mapping file too: each name pairs under every state kind (param.,
// grad., param_after., momentum., buffer., buffer_after.) and, for param and buffer, with the bare
// MindSpore name. Value conversions cannot be applied here and are refused.
//
// Automatic matching aligns the unmatched tensors of both sides in execution order (a longest common
// subsequence where two tensors are compatible when their shapes are equal and their kinds agree or
// are unknown), so an extra or missing tensor shifts nothing after it. A pair is ambiguous when
// another optimal alignment would pair one of its tensors differently; every ambiguity is reported.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/tensor_set.hpp"

namespace wb::compare {

struct MappingFile {
  struct Rule {
    std::string pattern;
    std::string replace;
    std::regex re;
  };
  struct ThresholdRule {
    std::string pattern;
    std::regex re;
    nlohmann::json fields;  // verdict.hpp's apply_threshold_override
  };
  std::string origin;  // file name, for messages
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<Rule> rules;
  std::vector<ThresholdRule> thresholds;
  bool auto_match = true;

  // A's key after the rules (unchanged when none matches).
  std::string rewrite(std::string_view a_key) const;
};

// Throws CompareError naming the file and the offending entry (bad JSON, bad regex, wrong types).
MappingFile load_mapping(const std::filesystem::path& path);
MappingFile parse_mapping(const nlohmann::json& json, std::string_view origin);

enum class MatchMethod { exact, pair, rule, order_shape, none };
std::string_view method_name(MatchMethod method);

struct MatchedPair {
  std::optional<std::size_t> a;  // index into A's tensors; empty: only in B
  std::optional<std::size_t> b;  // index into B's tensors; empty: only in A
  MatchMethod method = MatchMethod::none;
};

struct Ambiguity {
  std::string key;                      // the tensor with several equally good partners
  bool in_a = true;                     // whether `key` is A's (else B's)
  std::string chosen;                   // the partner picked ("" when left unmatched)
  std::vector<std::string> candidates;  // every partner some optimal alignment gives it
};

struct MatchResult {
  std::vector<MatchedPair> pairs;  // matched pairs, then A-only, then B-only
  std::vector<Ambiguity> ambiguities;
};

struct MatchOptions {
  const MappingFile* mapping = nullptr;
  bool auto_match = true;  // also off when the mapping file says "auto": false
  // Above this many cells (unmatched A x unmatched B) the alignment is greedy instead (each A tensor
  // takes the next compatible B tensor in order) and reports no ambiguities.
  std::size_t max_alignment_cells = std::size_t{1} << 24;
};

MatchResult match_tensors(const TensorSet& a, const TensorSet& b, const MatchOptions& options = {});

}  // namespace wb::compare
