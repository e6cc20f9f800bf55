#include "server/json.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sieve::server {

namespace {

// Builds the document from nlohmann's SAX events. Each open object has a hash index of its keys,
// so a key is placed in O(1); a repeated key's value replaces the earlier one in its place.
class Builder final : public nlohmann::json_sax<json> {
 public:
  json take() { return std::move(root_); }

  bool null() override { return place(json(nullptr)); }
  bool boolean(bool value) override { return place(json(value)); }
  bool number_integer(number_integer_t value) override { return place(json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return place(json(value)); }
  bool number_float(number_float_t value, const string_t&) override { return place(json(value)); }
  bool string(string_t& value) override { return place(json(std::move(value))); }
  bool binary(binary_t&) override { return false; }  // JSON text has none

  bool start_object(std::size_t) override { return open(json::object()); }
  bool key(string_t& name) override {
    Open& top = stack_.back();
    if (!top.keys) top.keys = std::make_unique<std::unordered_map<std::string, size_t>>();
    auto& object = top.value->get_ref<json::object_t&>();
    const auto [it, inserted] = top.keys->try_emplace(name, object.size());
    // The vector's own emplace_back: ordered_map's emplace would scan for the key again.
    if (inserted) object.emplace_back(std::move(name), nullptr);
    slot_ = &(object.begin() + static_cast<std::ptrdiff_t>(it->second))->second;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  struct Open {
    json* value;
    std::unique_ptr<std::unordered_map<std::string, size_t>> keys;  // objects: key -> index
  };

  // Where the value goes: the root, the end of the open array, or the slot of the last key.
  json* place_at(json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& container = *stack_.back().value;
    if (container.is_array()) {
      auto& array = container.get_ref<json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool place(json&& value) {
    place_at(std::move(value));
    return true;
  }
  bool open(json&& container) {
    stack_.push_back({.value = place_at(std::move(container)), .keys = nullptr});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json root_;
  std::vector<Open> stack_;  // the containers being filled, innermost last
  json* slot_ = nullptr;
};

}  // namespace

std::optional<json> parse_json(std::string_view text) {
  Builder builder;
  if (!json::sax_parse(text, &builder)) return std::nullopt;
  return builder.take();
}

}  // namespace sieve::server
