#pragma once
// Adaptive draft length ("adaptive": true in a speculative config): each sequence's k moves in
// [0, num_speculative_tokens] with its own recent acceptance and what a draft token costs.
//
// Model: each draft token is accepted with probability a, independently, until the first
// rejection. With k drafts a step yields E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
// tokens and costs 1 + c * k plain decode steps (c: one draft token's drafting and verification
// relative to a plain step, measured by speculative::StepCost). k is the argmax of E(k) / (1 + c *
// k) over k >= 0 (k = 0: a plain step, rate 1): a token is drafted while the chance that it is
// accepted pays for it. With c = 0.2: a = 0.99 -> 16, 0.95 -> 10, 0.9 -> 7, 0.8 -> 4, 0.7 -> 3,
// 0.6 -> 2, 0.25 to 0.5 -> 1, 0.2 and below -> 0 (then capped at num_speculative_tokens). Where a
// draft pass costs about a whole step (c ~ 1, a tiny model drafting itself), no acceptance pays and
// the sequence decodes plainly.
//
// a is an exponential moving average over the sequence's verified draft positions: each accepted
// one moves it towards 1, the rejected one (if any) towards 0, by kStep (memory: ~10 positions).
// A rejection weighs as much as an accepted position, so after a long copy span k falls from 8
// to 4 in three steps whose first draft is rejected, and climbs back as fast once drafts hold.
// Before any verification, a = kPriorAcceptance. While k is 0 for want of acceptance nothing is
// verified, so every kProbeInterval-th step drafts one token anyway: acceptance stays measured,
// and speculation comes back when the text turns repetitive. While it is 0 because c >= 1 (no
// acceptance could pay), nothing is probed: c itself is measured on plain steps, and drafting
// resumes when it falls (the batch shrinks).
#include <cstdint>

namespace sieve::speculative {

class DraftLength {
 public:
  static constexpr double kStep = 0.1;             // EMA weight of one draft position
  static constexpr double kPriorAcceptance = 0.8;  // a before any draft was verified
  static constexpr int32_t kProbeInterval = 16;    // while off: one draft token every 16 steps

  explicit DraftLength(int32_t max_tokens);

  // k for the sequence's next step at draft token cost c, in [0, max_tokens]. Call once per
  // decode step: it counts the steps between probes.
  int32_t next(double cost);
  // A draft of num_drafted tokens was verified and its first num_accepted taken.
  void record(int32_t num_drafted, int32_t num_accepted);
  double acceptance() const { return acceptance_; }

  // argmax over k in [0, max_tokens] of E(k) / (1 + cost * k) at acceptance a (ties: smaller k).
  static int32_t best_length(double acceptance, double cost, int32_t max_tokens);

 private:
  int32_t max_tokens_;
  double acceptance_ = kPriorAcceptance;
  int32_t steps_off_ = 0;  // consecutive steps with k = 0
};

}  // namespace sieve::speculative
