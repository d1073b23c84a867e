// Python bindings of the native history index (module sglang_histospec.drafting._native).
//
// Token inputs come in two forms with distinct names, so no overload resolution runs per call: `*_array`
// methods take 1-D C-contiguous int32 numpy arrays without copying, the plain ones take lists of ints.
// Methods marked "debug" walk whole structures and are not meant for the serving loop.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "anchors.h"
#include "drafter.h"
#include "sais.h"

namespace py = pybind11;
using histospec::Config;
using histospec::Drafter;
using histospec::DraftOut;
using histospec::Span;
using histospec::anchors::AnchorDrafter;

namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

const char* const kSourceNames[] = {"history", "siblings", "self", "global", "running", "mixed", "anchors"};
static_assert(histospec::anchors::kAnchorSource == 6, "kSourceNames is indexed by DraftOut::source");

Span checked(Span s) {
  for (int64_t i = 0; i < s.size; ++i)
    if (s.data[i] < 0) throw std::invalid_argument("token id " + std::to_string(s.data[i]) + " is negative");
  return s;
}

Span span_of(const I32Array& a) {
  if (a.ndim() != 1) throw std::invalid_argument("expected a 1-D int32 array, got ndim=" + std::to_string(a.ndim()));
  return checked({a.data(), static_cast<int64_t>(a.shape(0))});
}

void check_weights(const std::vector<int64_t>& weights) {
  for (int64_t w : weights)
    if (w < 1) throw std::invalid_argument("weight " + std::to_string(w) + " < 1: weights are integers >= 1");
}

std::vector<Span> spans_of(const std::vector<I32Array>& arrays) {
  std::vector<Span> out;
  out.reserve(arrays.size());
  for (const auto& a : arrays) out.push_back(span_of(a));
  return out;
}

std::array<bool, histospec::kNumSources> parse_sources(const std::vector<std::string>& sources) {
  std::array<bool, histospec::kNumSources> on{};
  for (const auto& s : sources) {
    bool found = false;
    for (int i = 0; i < histospec::kNumSources; ++i)
      if (s == kSourceNames[i]) on[i] = found = true;
    if (!found)
      throw std::invalid_argument("unknown source '" + s + "': expected history, siblings, self, global or running");
  }
  return on;
}

void check_threads(int32_t draft_threads) {
  if (draft_threads < 1)
    throw std::invalid_argument("draft_threads=" + std::to_string(draft_threads) + ": expected an int >= 1");
}

Config make_config(int32_t min_match, int32_t max_match, bool tree, double min_prob, bool use_frequency,
                   const std::vector<std::string>& sources, int32_t draft_threads) {
  check_threads(draft_threads);
  Config c;
  c.draft_threads = draft_threads;
  c.min_match = min_match;
  c.max_match = max_match;
  c.tree = tree;
  c.min_prob = min_prob;
  c.use_frequency = use_frequency;
  c.sources = parse_sources(sources);
  if (c.sources[histospec::kRunning])
    throw std::invalid_argument("source 'running': the counts scorer has none; use the anchor scorer");
  return c;
}

histospec::anchors::Config make_anchor_config(int32_t min_match, int32_t max_match, int32_t prompt_tail,
                                              const std::vector<std::string>& sources, int32_t draft_threads) {
  check_threads(draft_threads);
  if (min_match < 1 || max_match < min_match || prompt_tail < 0)
    throw std::invalid_argument("min_match=" + std::to_string(min_match) + ", max_match=" +
                                std::to_string(max_match) + ", prompt_tail=" + std::to_string(prompt_tail) +
                                ": expected 1 <= min_match <= max_match and prompt_tail >= 0");
  histospec::anchors::Config c;
  c.min_match = min_match;
  c.max_match = max_match;
  c.prompt_tail = prompt_tail;
  c.sources = parse_sources(sources);
  c.draft_threads = draft_threads;
  return c;
}

// [rows, cols] array holding a copy of v (row-major)
py::array_t<int64_t> table(const std::vector<int64_t>& v, py::ssize_t rows, py::ssize_t cols) {
  py::array_t<int64_t> a({rows, cols});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::list to_python(std::vector<DraftOut>& drafts) {
  py::list out(drafts.size());
  for (size_t i = 0; i < drafts.size(); ++i) {
    DraftOut& d = drafts[i];
    out[i] = py::make_tuple(py::cast(d.tokens), py::cast(d.parents), py::cast(d.probs), d.match_len,
                            d.source < 0 ? "" : kSourceNames[d.source]);
  }
  return out;
}

// The backend interface (docs/drafting.md section 9), shared by Drafter and AnchorDrafter.
template <class D>
void bind_backend(py::class_<D>& c) {
  c.def(
       "set_history",
       [](D& d, const std::string& prompt_id, const std::vector<I32Array>& seqs, const std::vector<int64_t>& weights) {
         if (seqs.size() != weights.size()) throw std::invalid_argument("one weight per sequence");
         check_weights(weights);
         const auto spans = spans_of(seqs);  // the arrays stay referenced by `seqs` while the GIL is free
         py::gil_scoped_release release;
         d.set_history(prompt_id, spans, weights);
       },
       py::arg("prompt_id"), py::arg("sequences"), py::arg("weights"),
       "Replace a prompt's history (builds the new index without the GIL, then swaps it in); [] removes it.")
      .def(
          "add_sibling",
          [](D& d, const std::string& prompt_id, const I32Array& seq, int64_t weight) {
            const Span span = span_of(seq);
            check_weights({weight});
            py::gil_scoped_release release;  // builds an index (and may merge sibling parts)
            d.add_sibling(prompt_id, span, weight);
          },
          py::arg("prompt_id"), py::arg("sequence"), py::arg("weight"))
      .def("clear_siblings", &D::clear_siblings)
      .def(
          "add_global",
          [](D& d, int64_t key, const std::vector<I32Array>& seqs, const std::vector<int64_t>& weights) {
            if (seqs.size() != weights.size()) throw std::invalid_argument("one weight per sequence");
            check_weights(weights);
            const auto spans = spans_of(seqs);
            py::gil_scoped_release release;
            d.add_global(key, spans, weights);
          },
          py::arg("key"), py::arg("sequences"), py::arg("weights"))
      .def("remove_global", &D::remove_global, py::arg("key"))
      .def(
          "start",
          [](D& d, const std::string& req_id, std::optional<std::string> prompt_id,
             const std::vector<int32_t>& tokens) {
            d.start(req_id, prompt_id ? &*prompt_id : nullptr,
                    checked({tokens.data(), static_cast<int64_t>(tokens.size())}));
          },
          py::arg("req_id"), py::arg("prompt_id"), py::arg("prompt_tokens"))
      .def(
          "start_array",
          [](D& d, const std::string& req_id, std::optional<std::string> prompt_id, const I32Array& tokens) {
            d.start(req_id, prompt_id ? &*prompt_id : nullptr, span_of(tokens));
          },
          py::arg("req_id"), py::arg("prompt_id"), py::arg("prompt_tokens"))
      .def(
          "extend",
          [](D& d, const std::string& req_id, const std::vector<int32_t>& tokens) {
            d.extend(req_id, checked({tokens.data(), static_cast<int64_t>(tokens.size())}));
          },
          py::arg("req_id"), py::arg("tokens"))
      .def(
          "extend_array",
          [](D& d, const std::string& req_id, const I32Array& tokens) { d.extend(req_id, span_of(tokens)); },
          py::arg("req_id"), py::arg("tokens"))
      .def("remove_request", &D::remove_request, py::arg("req_id"))
      .def("has_request", &D::has_request, py::arg("req_id"))
      .def(
          "draft_batch",
          [](D& d, const std::vector<std::string>& req_ids, const std::vector<int32_t>& budgets) {
            if (req_ids.size() != budgets.size()) throw std::invalid_argument("one budget per request");
            std::vector<DraftOut> drafts;
            {
              py::gil_scoped_release release;
              drafts = d.draft_batch(req_ids, budgets);
            }
            return to_python(drafts);
          },
          py::arg("req_ids"), py::arg("budgets"),
          "Per request (token_ids, parents, probs, match_len, source); drafts without the GIL.")
      .def(
          "draft_batch_timed",
          [](D& d, const std::vector<std::string>& req_ids, const std::vector<int32_t>& budgets, int32_t threads) {
            if (req_ids.size() != budgets.size()) throw std::invalid_argument("one budget per request");
            if (threads < 0) throw std::invalid_argument("threads=" + std::to_string(threads) + ": expected >= 0");
            std::vector<DraftOut> drafts;
            std::vector<int64_t> ns;
            {
              py::gil_scoped_release release;
              drafts = d.draft_batch(req_ids, budgets, &ns, threads);
            }
            return py::make_tuple(to_python(drafts), ns);
          },
          py::arg("req_ids"), py::arg("budgets"), py::arg("threads") = 0,
          "Benchmarks: draft_batch on at most `threads` threads (0: draft_threads), plus the wall time of each "
          "request's draft in nanoseconds.")
      .def("draft_threads", &D::draft_threads, "Threads a draft_batch spreads its requests over.")
      .def("memory_bytes", &D::memory_bytes)
      .def("check_integrity", &D::check_integrity,
           "Debug: '' when every structure is consistent, else the first broken invariant.");
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Native history index of sglang-histospec (semantics: docs/drafting.md)";
  m.attr("ABI_VERSION") = 5;  // 3: AnchorDrafter; 4: the running source; 5: draft_threads

  m.def(
      "suffix_array",
      [](const I32Array& s, int32_t alphabet) {
        Span sp = span_of(s);
        for (int64_t i = 0; i < sp.size; ++i)
          if (sp.data[i] < 0 || sp.data[i] >= alphabet) throw std::invalid_argument("character outside the alphabet");
        std::vector<int32_t> sa(sp.size);
        histospec::suffix_array(sp.data, static_cast<int32_t>(sp.size), alphabet, sa.data());
        return sa;
      },
      py::arg("s"), py::arg("alphabet"), "Debug: suffix array of s (characters in [0, alphabet)).");

  py::class_<Drafter> drafter(m, "Drafter");
  drafter.def(py::init([](int32_t min_match, int32_t max_match, bool tree, double min_prob, bool use_frequency,
                          const std::vector<std::string>& sources, int32_t draft_threads) {
                return new Drafter(
                    make_config(min_match, max_match, tree, min_prob, use_frequency, sources, draft_threads));
              }),
              py::kw_only(), py::arg("min_match"), py::arg("max_match"), py::arg("tree"), py::arg("min_prob"),
              py::arg("use_frequency"), py::arg("sources"), py::arg("draft_threads") = 1);
  bind_backend(drafter);
  drafter.def("history_tokens", &Drafter::history_tokens)
      .def("num_prompts", &Drafter::num_prompts)
      .def("num_requests", &Drafter::num_requests);

  {
    using namespace histospec::anchors;
    py::dict k;  // the constants of sglang_histospec/drafting/anchors.py this build mirrors (checked at import)
    k["DEPTH_MAX"] = kDepthMax;
    k["SCAN"] = kScan;
    k["MAX_ANCHORS"] = kMaxAnchors;
    k["HAM_WINDOW"] = kHamWindow;
    k["SUB_MIN_MATCH"] = kSubMinMatch;
    k["GLOBAL_MIN_MATCH"] = kGlobalMinMatch;
    k["LENGTH_EDGES"] = py::tuple(py::cast(std::vector<int32_t>(kLengthEdges.begin(), kLengthEdges.end())));
    k["SCORE_EDGES"] = py::tuple(py::cast(std::vector<double>(kScoreEdges.begin(), kScoreEdges.end())));
    k["RATE_PRIOR"] = kRatePrior;
    k["RATE_PRIOR_NODES"] = kRatePriorNodes;
    k["RECAL_PRIOR_NODES"] = kRecalPriorNodes;
    k["NUM_EXTRA"] = kNumExtra;
    k["NUM_CLASSES"] = kNumClasses;
    k["NUM_BINS"] = py::make_tuple(kNumLengthClasses, kNumScoreBins, kNumScoreBins, kShareClasses);
    m.attr("ANCHOR_CONSTANTS") = k;
  }
  py::class_<AnchorDrafter> anchors(m, "AnchorDrafter",
                                    "The anchor scorer (drafts and learning of sglang_histospec/drafting/anchors.py).");
  anchors.def(py::init([](int32_t min_match, int32_t max_match, int32_t prompt_tail,
                          const std::vector<std::string>& sources, int32_t draft_threads) {
                return new AnchorDrafter(make_anchor_config(min_match, max_match, prompt_tail, sources, draft_threads));
              }),
              py::kw_only(), py::arg("min_match"), py::arg("max_match"), py::arg("prompt_tail"), py::arg("sources"),
              py::arg("draft_threads") = 1);
  bind_backend(anchors);
  anchors.def(
      "learnt_counts",
      [](const AnchorDrafter& d) {
        using namespace histospec::anchors;
        const auto t = d.learnt_counts();
        return py::make_tuple(table(t[0], kNumClasses, kDepthMax), table(t[1], kNumClasses, kDepthMax),
                              table(t[2], kNumLengthClasses * kNumScoreBins * kNumScoreBins, kShareClasses),
                              table(t[3], kNumLengthClasses * kNumScoreBins * kNumScoreBins, kShareClasses));
      },
      "Debug: copies of (tries, hits) [classes, depth] and (bin_nodes, bin_hits) [length class x score bin x best rate bin, share class].");
}
