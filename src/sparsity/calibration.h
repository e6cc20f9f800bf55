#pragma once
// The calibration profile `sieve calibrate` writes: per (layer, KV head) how streaming-like the
// head is, measured on sample prompts. lserve and heads:...@profile=F turn the most
// streaming-like fraction of heads into sink + window heads (policy_spec.h).
//
// File format (JSON, one object):
//   {
//     "format": "sieve-calibration",
//     "version": 1,
//     "model": {"name": "stories260K", "fingerprint": "..."},   // who it was measured on
//     "num_layers": 5,
//     "num_kv_heads": 4,
//     "method": "...",                                            // optional, free text
//     "num_samples": 16,                                          // optional, prompts used
//     "streaming_scores": [[0.91, 0.12, 0.55, 0.08], ...]        // [num_layers][num_kv_heads]
//   }
// A streaming score is in [0, 1]; higher = the head's attention is better served by attention
// sinks + a local window (e.g. the fraction of its attention mass that falls on them:
// streaming_score() in selection.h). The fingerprint is whatever string the writer uses to
// identify the model (the engine compares it before use); it must not be empty.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::sparsity {

struct CalibrationProfile {
  std::string model_name;
  std::string model_fingerprint;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  std::string method;                    // optional
  int64_t num_samples = 0;               // optional (0 = not recorded)
  std::vector<double> streaming_scores;  // [layer * num_kv_heads + kv_head]

  double score(int64_t layer, int64_t kv_head) const {
    return streaming_scores[static_cast<size_t>(layer * num_kv_heads + kv_head)];
  }
  friend bool operator==(const CalibrationProfile&, const CalibrationProfile&) = default;
};

// Throws sieve::Error saying what is wrong: empty model name/fingerprint, non-positive shape,
// wrong number of scores, a score outside [0, 1] or not finite, negative num_samples.
void validate(const CalibrationProfile& profile);

// JSON text <-> profile (validated both ways). Errors name the field.
CalibrationProfile parse_calibration(std::string_view json_text);
std::string to_json(const CalibrationProfile& profile);  // pretty-printed, ends with '\n'

// Files. Errors name the path.
CalibrationProfile load_calibration(const std::string& path);
void save_calibration(const CalibrationProfile& profile, const std::string& path);

}  // namespace sieve::sparsity
