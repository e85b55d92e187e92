#include "compare/match.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace wb::compare {
namespace {

std::regex compile(const std::string& pattern, std::string_view origin, const std::string& where) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw CompareError(std::string(origin) + ": " + where + ": bad regular expression '" + pattern + "' (" + e.what() + ")");
  }
}

std::string require_string(const nlohmann::json& j, const char* field, std::string_view origin, const std::string& where) {
  const auto it = j.find(field);
  if (it == j.end() || !it->is_string()) {
    throw CompareError(std::string(origin) + ": " + where + " needs a string field \"" + field + "\"");
  }
  return it->get<std::string>();
}

bool compatible(const NamedTensor& x, const NamedTensor& y) {
  if (x.tensor.shape != y.tensor.shape) return false;
  const TensorKind kx = kind_of_key(x.key), ky = kind_of_key(y.key);
  return kx == ky || kx == TensorKind::other || ky == TensorKind::other;
}

std::vector<std::size_t> by_exec_order(const TensorSet& set, const std::vector<bool>& taken) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < set.tensors.size(); ++i) {
    if (!taken[i]) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(),
                   [&](std::size_t x, std::size_t y) { return set.tensors[x].exec_order < set.tensors[y].exec_order; });
  return out;
}

}  // namespace

std::string MappingFile::rewrite(std::string_view a_key) const {
  std::string key(a_key);
  for (const auto& r : rules) {
    if (std::regex_search(key, r.re)) key = std::regex_replace(key, r.re, r.replace);
  }
  return key;
}

namespace {

// TroubleShooter's weight map (ts.migrator.get_weight_map writes [name_map, value_map], name_map
// {PyTorch state_dict name: MindSpore name}): A's names are PyTorch's, B's MindSpore's, so every dump
// key of a state tensor pairs up (param./grad./param_after./momentum./buffer./buffer_after.), and
// the MindSpore name alone for a reference saved without our prefixes.
MappingFile parse_weight_map(const nlohmann::json& names, const nlohmann::json* values, std::string_view origin) {
  MappingFile m;
  m.origin = std::string(origin);
  for (const auto& [pt, ms] : names.items()) {
    if (!ms.is_string()) {
      throw CompareError(m.origin + ": weight map entry \"" + pt + "\" must be a string (the MindSpore name)");
    }
    const std::string b = ms.get<std::string>();
    for (const char* kind : {"param", "grad", "param_after", "momentum", "buffer", "buffer_after"}) {
      m.pairs.emplace_back(make_key(kind, pt), make_key(kind, b));
    }
    m.pairs.emplace_back(make_key("param", pt), b);
    m.pairs.emplace_back(make_key("buffer", pt), b);
  }
  if (values != nullptr) {
    if (!values->is_object()) throw CompareError(m.origin + ": the weight map's second element must be an object");
    if (!values->empty()) {
      throw CompareError(m.origin + ": the weight map converts the value of \"" + values->begin().key() + "\" with " +
                         values->begin().value().dump() +
                         ", which wb cannot apply (expected an empty value map: compare converted tensors instead)");
    }
  }
  return m;
}

bool is_weight_map(const nlohmann::json& json) {
  return json.is_array() && !json.empty() && json.size() <= 2 && json[0].is_object() &&
         (json.size() == 1 || json[1].is_object());
}

}  // namespace

MappingFile parse_mapping(const nlohmann::json& json, std::string_view origin) {
  if (is_weight_map(json)) return parse_weight_map(json[0], json.size() > 1 ? &json[1] : nullptr, origin);
  MappingFile m;
  m.origin = std::string(origin);
  if (!json.is_object()) {
    throw CompareError(m.origin + ": a mapping file must be a JSON object with \"pairs\", \"rules\", \"thresholds\" or \"auto\", "
                       "or TroubleShooter's weight map [{PyTorch name: MindSpore name}, {}]");
  }
  for (const auto& [key, value] : json.items()) {
    if (key == "pairs") {
      // An object {a: b} or a list of [a, b] pairs.
      if (value.is_object()) {
        for (const auto& [ak, bv] : value.items()) {
          if (!bv.is_string()) throw CompareError(m.origin + ": pairs[\"" + ak + "\"] must be a string (B's name)");
          m.pairs.emplace_back(ak, bv.get<std::string>());
        }
      } else if (value.is_array()) {
        for (std::size_t i = 0; i < value.size(); ++i) {
          const auto& p = value[i];
          if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string()) {
            throw CompareError(m.origin + ": pairs[" + std::to_string(i) + "] must be [\"A name\", \"B name\"]");
          }
          m.pairs.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
        }
      } else {
        throw CompareError(m.origin + ": \"pairs\" must be an object {A name: B name} or a list of [A, B]");
      }
    } else if (key == "rules") {
      if (!value.is_array()) throw CompareError(m.origin + ": \"rules\" must be a list of {\"pattern\", \"replace\"}");
      for (std::size_t i = 0; i < value.size(); ++i) {
        const std::string where = "rules[" + std::to_string(i) + "]";
        if (!value[i].is_object()) throw CompareError(m.origin + ": " + where + " must be an object");
        MappingFile::Rule r;
        r.pattern = require_string(value[i], "pattern", m.origin, where);
        r.replace = require_string(value[i], "replace", m.origin, where);
        r.re = compile(r.pattern, m.origin, where);
        m.rules.push_back(std::move(r));
      }
    } else if (key == "thresholds") {
      if (!value.is_array()) {
        throw CompareError(m.origin + ": \"thresholds\" must be a list of {\"match\": regex, <threshold>: value}");
      }
      for (std::size_t i = 0; i < value.size(); ++i) {
        const std::string where = "thresholds[" + std::to_string(i) + "]";
        if (!value[i].is_object()) throw CompareError(m.origin + ": " + where + " must be an object");
        MappingFile::ThresholdRule t;
        t.pattern = require_string(value[i], "match", m.origin, where);
        t.re = compile(t.pattern, m.origin, where);
        t.fields = value[i];
        m.thresholds.push_back(std::move(t));
      }
    } else if (key == "auto") {
      if (!value.is_boolean()) throw CompareError(m.origin + ": \"auto\" must be true or false");
      m.auto_match = value.get<bool>();
    } else {
      throw CompareError(m.origin + ": unknown field \"" + key + "\" (expected pairs, rules, thresholds, auto)");
    }
  }
  return m;
}

MappingFile load_mapping(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw CompareError(path.string() + ": cannot open the mapping file");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(path.string() + ": the mapping file is not valid JSON (" + e.what() + ")");
  }
  return parse_mapping(json, path.string());
}

std::string_view method_name(MatchMethod method) {
  switch (method) {
    case MatchMethod::exact: return "exact";
    case MatchMethod::pair: return "pair";
    case MatchMethod::rule: return "rule";
    case MatchMethod::order_shape: return "order+shape";
    case MatchMethod::none: return "none";
  }
  return "?";
}

MatchResult match_tensors(const TensorSet& a, const TensorSet& b, const MatchOptions& options) {
  MatchResult result;
  std::vector<bool> a_taken(a.tensors.size(), false), b_taken(b.tensors.size(), false);
  const MappingFile* map = options.mapping;
  auto take = [&](std::size_t i, std::size_t j, MatchMethod how) {
    a_taken[i] = b_taken[j] = true;
    result.pairs.push_back({i, j, how});
  };

  // Names: explicit pairs, then rules, then the name itself.
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const std::string& key = a.tensors[i].key;
    if (map != nullptr) {
      // The first pair naming this key whose B tensor exists and is free.
      bool paired = false;
      for (const auto& p : map->pairs) {
        if (p.first != key) continue;
        if (auto j = b.position(p.second); j && !b_taken[*j]) {
          take(i, *j, MatchMethod::pair);
          paired = true;
          break;
        }
      }
      if (paired) continue;
      if (const std::string rewritten = map->rewrite(key); rewritten != key) {
        if (auto j = b.position(rewritten); j && !b_taken[*j]) {
          take(i, *j, MatchMethod::rule);
          continue;
        }
      }
    }
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    if (a_taken[i]) continue;
    if (auto j = b.position(a.tensors[i].key); j && !b_taken[*j]) take(i, *j, MatchMethod::exact);
  }

  const bool auto_match = options.auto_match && (map == nullptr || map->auto_match);
  const std::vector<std::size_t> ua = by_exec_order(a, a_taken), ub = by_exec_order(b, b_taken);
  if (auto_match && !ua.empty() && !ub.empty()) {
    const std::size_t n = ua.size(), m = ub.size();
    auto ok = [&](std::size_t i, std::size_t j) { return compatible(a.tensors[ua[i]], b.tensors[ub[j]]); };
    if ((n + 1) * (m + 1) > options.max_alignment_cells) {
      std::size_t j = 0;
      for (std::size_t i = 0; i < n && j < m; ++i) {
        std::size_t k = j;
        while (k < m && !ok(i, k)) ++k;
        if (k < m) {
          take(ua[i], ub[k], MatchMethod::order_shape);
          j = k + 1;
        }
      }
    } else {
      // F: longest alignment of prefixes; G: of suffixes. (i, j) lies on an optimal alignment iff
      // F[i][j] + 1 + G[i+1][j+1] == best.
      const std::size_t w = m + 1;
      std::vector<std::uint32_t> f((n + 1) * w, 0), g((n + 1) * w, 0);
      for (std::size_t i = 1; i <= n; ++i) {
        for (std::size_t j = 1; j <= m; ++j) {
          f[i * w + j] = ok(i - 1, j - 1) ? f[(i - 1) * w + j - 1] + 1 : std::max(f[(i - 1) * w + j], f[i * w + j - 1]);
        }
      }
      for (std::size_t i = n; i-- > 0;) {
        for (std::size_t j = m; j-- > 0;) {
          g[i * w + j] = ok(i, j) ? g[(i + 1) * w + j + 1] + 1 : std::max(g[(i + 1) * w + j], g[i * w + j + 1]);
        }
      }
      const std::uint32_t best = f[n * w + m];
      auto on_optimal = [&](std::size_t i, std::size_t j) {
        return ok(i, j) && f[i * w + j] + 1 + g[(i + 1) * w + j + 1] == best;
      };
      // One optimal alignment, taking the earliest partner at each step.
      std::vector<std::optional<std::size_t>> a_partner(n), b_partner(m);
      for (std::size_t i = 0, j = 0; i < n && j < m;) {
        if (on_optimal(i, j) && g[i * w + j] == g[(i + 1) * w + j + 1] + 1) {
          a_partner[i] = j;
          b_partner[j] = i;
          take(ua[i], ub[j], MatchMethod::order_shape);
          ++i;
          ++j;
        } else if (g[(i + 1) * w + j] == g[i * w + j]) {
          ++i;
        } else {
          ++j;
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        Ambiguity amb;
        for (std::size_t j = 0; j < m; ++j) {
          if (on_optimal(i, j)) amb.candidates.push_back(b.tensors[ub[j]].key);
        }
        const std::size_t need = a_partner[i] ? 2 : 1;
        if (amb.candidates.size() >= need) {
          amb.key = a.tensors[ua[i]].key;
          amb.in_a = true;
          amb.chosen = a_partner[i] ? b.tensors[ub[*a_partner[i]]].key : std::string();
          result.ambiguities.push_back(std::move(amb));
        }
      }
      // B tensors left out although some optimal alignment uses them.
      for (std::size_t j = 0; j < m; ++j) {
        if (b_partner[j]) continue;
        Ambiguity amb;
        for (std::size_t i = 0; i < n; ++i) {
          if (on_optimal(i, j)) amb.candidates.push_back(a.tensors[ua[i]].key);
        }
        if (!amb.candidates.empty()) {
          amb.key = b.tensors[ub[j]].key;
          amb.in_a = false;
          result.ambiguities.push_back(std::move(amb));
        }
      }
    }
  }

  for (std::size_t i : by_exec_order(a, a_taken)) result.pairs.push_back({i, std::nullopt, MatchMethod::none});
  for (std::size_t j : by_exec_order(b, b_taken)) result.pairs.push_back({std::nullopt, j, MatchMethod::none});
  return result;
}

}  // namespace wb::compare
