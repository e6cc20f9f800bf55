#include "kv/precise_areas.h"

#include <fmt/format.h>

#include <cassert>
#include <utility>

namespace sieve::kv {

PreciseAreas::PreciseAreas(std::vector<int32_t> streams, int32_t num_streams, int32_t num_pages,
                           int32_t num_spare)
    : streams_(std::move(streams)), num_pages_(num_pages), num_spare_(num_spare) {
  assert(num_pages >= 0 && num_spare >= 0);
  if (!streams_.empty()) rank_.assign(static_cast<size_t>(num_streams), -1);
  for (size_t r = 0; r < streams_.size(); ++r) {
    assert(streams_[r] >= 0 && streams_[r] < num_streams);
    assert((r == 0 || streams_[r] > streams_[r - 1]) && "precise streams must be ascending");
    rank_[static_cast<size_t>(streams_[r])] = static_cast<int32_t>(r);
  }
  if (streams_.empty()) num_spare_ = 0;
  // Handed out lowest first.
  const int32_t first = num_precise() * num_pages_;
  for (int32_t i = num_spare_ - 1; i >= 0; --i) free_spares_.push_back(AreaId{first + i});
}

std::optional<AreaId> PreciseAreas::take_spare() {
  if (free_spares_.empty()) return std::nullopt;
  const AreaId area = free_spares_.back();
  free_spares_.pop_back();
  return area;
}

void PreciseAreas::give_back_spare(AreaId area) {
  assert(is_spare(area) && area.value < num_areas());
  free_spares_.push_back(area);
}

std::optional<std::string> PreciseAreas::invariant_violation(std::span<const AreaId> held) const {
  std::vector<uint8_t> seen(static_cast<size_t>(num_spare_), 0);
  const int32_t first = num_precise() * num_pages_;
  const auto claim = [&](AreaId area, const char* what) -> std::optional<std::string> {
    if (!is_spare(area) || area.value >= num_areas())
      return fmt::format("{} area {} is not a spare", what, area.value);
    if (seen[static_cast<size_t>(area.value - first)]++)
      return fmt::format("spare area {} is used twice", area.value);
    return std::nullopt;
  };
  for (AreaId area : free_spares_) {
    if (auto violation = claim(area, "free")) return violation;
  }
  for (AreaId area : held) {
    if (auto violation = claim(area, "held")) return violation;
  }
  if (free_spares_.size() + held.size() != static_cast<size_t>(num_spare_)) {
    return fmt::format("{} free and {} held spares, of {}", free_spares_.size(), held.size(),
                       num_spare_);
  }
  return std::nullopt;
}

}  // namespace sieve::kv
