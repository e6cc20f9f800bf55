#include "util/json_text.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sieve {

namespace {

using Json = nlohmann::ordered_json;

// Builds the document from nlohmann's SAX events. Each open object has a hash index of its keys,
// so a key is placed in O(1); a repeated key's value replaces the earlier one in its place.
class Builder final : public nlohmann::json_sax<Json> {
 public:
  explicit Builder(size_t max_depth) : max_depth_(max_depth) {}
  Json take() { return std::move(root_); }
  bool too_deep() const { return too_deep_; }
  const std::string& error() const { return error_; }

  bool null() override { return place(Json(nullptr)); }
  bool boolean(bool value) override { return place(Json(value)); }
  bool number_integer(number_integer_t value) override { return place(Json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return place(Json(value)); }
  bool number_float(number_float_t value, const string_t&) override { return place(Json(value)); }
  bool string(string_t& value) override { return place(Json(std::move(value))); }
  bool binary(binary_t&) override { return false; }  // JSON text has none

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& name) override {
    Open& top = stack_.back();
    if (!top.keys) top.keys = std::make_unique<std::unordered_map<std::string, size_t>>();
    auto& object = top.value->get_ref<Json::object_t&>();
    const auto [it, inserted] = top.keys->try_emplace(name, object.size());
    // The vector's own emplace_back: ordered_map's emplace would scan for the key again.
    if (inserted) object.emplace_back(std::move(name), nullptr);
    slot_ = &(object.begin() + static_cast<std::ptrdiff_t>(it->second))->second;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

 private:
  struct Open {
    Json* value;
    std::unique_ptr<std::unordered_map<std::string, size_t>> keys;  // objects: key -> index
  };

  // Where the value goes: the root, the end of the open array, or the slot of the last key.
  Json* place_at(Json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& container = *stack_.back().value;
    if (container.is_array()) {
      auto& array = container.get_ref<Json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool place(Json&& value) {
    place_at(std::move(value));
    return true;
  }
  bool open(Json&& container) {
    if (stack_.size() >= max_depth_) {
      too_deep_ = true;
      return false;  // stops the parse
    }
    stack_.push_back({.value = place_at(std::move(container)), .keys = nullptr});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  const size_t max_depth_;
  Json root_;
  std::vector<Open> stack_;  // the containers being filled, innermost last
  Json* slot_ = nullptr;
  bool too_deep_ = false;
  std::string error_;
};

}  // namespace

JsonParse parse_ordered_json(std::string_view text, size_t max_depth) {
  Builder builder(max_depth);
  JsonParse out;
  if (Json::sax_parse(text, &builder)) {
    out.status = JsonParse::Status::kOk;
    out.value = builder.take();
  } else if (builder.too_deep()) {
    out.status = JsonParse::Status::kTooDeep;
  } else {
    out.status = JsonParse::Status::kInvalid;
    out.error = builder.error();
  }
  return out;
}

}  // namespace sieve
