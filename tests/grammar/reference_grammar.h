#pragma once
// A second reading of the GBNF dialect (src/grammar/grammar.h), written the simple, slow way and
// sharing no code with src/grammar/, to judge what the fast recognizer and its masks say.
//
// The grammar text is parsed here into a tree (alternatives, sequences, literals, classes,
// rule references, repetitions), and a text is matched against it as a context-free language:
// for an item and a start position, the set of positions where a match can end, plus whether
// the text can run out inside the item (so that the text is a prefix of something longer the
// item matches). Exponential in the worst case and without left-recursion handling: the
// grammars it judges are small, and the project's compiler refuses left recursion.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve::grammar::reference {

// UTF-8 to code points; nullopt for invalid or incomplete UTF-8.
inline std::optional<std::vector<uint32_t>> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > text.size()) return std::nullopt;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out.push_back(cp);
    i += len;
  }
  return out;
}

struct Node {
  enum class Kind { kAlternatives, kSequence, kLiteral, kClass, kAny, kRule, kRepeat };
  Kind kind = Kind::kSequence;
  std::vector<std::unique_ptr<Node>> children;        // alternatives, sequence, repeat (one)
  std::vector<uint32_t> literal;                      // kLiteral
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kClass
  bool negated = false;                               // kClass
  std::string rule;                                   // kRule
  int min = 0, max = -1;                              // kRepeat; max -1: unbounded
};

class Grammar {
 public:
  explicit Grammar(std::string_view text) : text_(text) {
    skip_space(true);
    while (pos_ < text_.size()) {
      const std::string name = read_name();
      skip_space(true);
      expect("::=");
      rules_[name] = parse_alternatives();
      skip_space(true);
    }
    if (!rules_.contains("root")) throw std::runtime_error("reference: no root");
  }

  // The whole text is a sentence of the grammar.
  bool accepts(std::string_view utf8) const { return match(utf8).whole; }
  // The text starts some sentence (it is one, or can be continued into one).
  bool accepts_prefix(std::string_view utf8) const {
    const Verdict v = match(utf8);
    return v.whole || v.prefix;
  }

 private:
  struct Verdict {
    bool whole = false;
    bool prefix = false;
  };
  struct Result {
    std::set<size_t> ends;
    bool runs_out = false;  // the text ends inside a match of the item
  };

  // --- parsing -------------------------------------------------------------------------------
  void skip_space(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  }
  std::string read_name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && name_char(text_[pos_])) ++pos_;
    if (pos_ == start) throw std::runtime_error("reference: expected a name");
    return std::string(text_.substr(start, pos_ - start));
  }
  void expect(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s)
      throw std::runtime_error("reference: expected " + std::string(s));
    pos_ += s.size();
  }
  // Whether a rule definition `name ::=` starts here (a rule body ends there).
  bool at_definition() const {
    size_t p = pos_;
    while (p < text_.size() && name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }
  std::unique_ptr<Node> parse_alternatives() {
    auto alts = std::make_unique<Node>();
    alts->kind = Node::Kind::kAlternatives;
    alts->children.push_back(parse_sequence());
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      alts->children.push_back(parse_sequence());
    }
    return alts;
  }
  std::unique_ptr<Node> parse_sequence() {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::Kind::kSequence;
    for (;;) {
      skip_space(true);
      if (pos_ >= text_.size() || text_[pos_] == '|' || text_[pos_] == ')' || at_definition())
        return seq;
      seq->children.push_back(parse_postfix(parse_item()));
    }
  }
  std::unique_ptr<Node> parse_item() {
    auto node = std::make_unique<Node>();
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      node->kind = Node::Kind::kLiteral;
      while (text_.at(pos_) != '"') node->literal.push_back(read_char());
      ++pos_;
    } else if (c == '[') {
      ++pos_;
      node->kind = Node::Kind::kClass;
      if (text_.at(pos_) == '^') {
        node->negated = true;
        ++pos_;
      }
      while (text_.at(pos_) != ']') {
        const uint32_t lo = read_char();
        uint32_t hi = lo;
        if (text_.at(pos_) == '-' && text_.at(pos_ + 1) != ']') {
          ++pos_;
          hi = read_char();
        }
        node->ranges.emplace_back(lo, hi);
      }
      ++pos_;
    } else if (c == '.') {
      ++pos_;
      node->kind = Node::Kind::kAny;
    } else if (c == '(') {
      ++pos_;
      node = parse_alternatives();
      skip_space(true);
      expect(")");
    } else {
      node->kind = Node::Kind::kRule;
      node->rule = read_name();
    }
    return node;
  }
  std::unique_ptr<Node> parse_postfix(std::unique_ptr<Node> item) {
    if (pos_ >= text_.size()) return item;
    int min = 0, max = -1;
    const char c = text_[pos_];
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      min = 1;
      ++pos_;
    } else if (c == '?') {
      max = 1;
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      min = read_int();
      max = min;
      if (text_.at(pos_) == ',') {
        ++pos_;
        max = text_.at(pos_) == '}' ? -1 : read_int();
      }
      expect("}");
    } else {
      return item;
    }
    auto repeat = std::make_unique<Node>();
    repeat->kind = Node::Kind::kRepeat;
    repeat->min = min;
    repeat->max = max;
    repeat->children.push_back(std::move(item));
    return repeat;
  }
  int read_int() {
    int v = 0;
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')
      v = v * 10 + (text_[pos_++] - '0');
    if (pos_ == start) throw std::runtime_error("reference: expected a number");
    return v;
  }
  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = text_.at(pos_++);
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }
  // One character of a literal or class: an escape or one UTF-8 character.
  uint32_t read_char() {
    if (text_.at(pos_) == '\\') {
      ++pos_;
      const char e = text_.at(pos_++);
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          return static_cast<unsigned char>(e);  // \" \\ \' \[ \] \- \/
      }
    }
    size_t len = 1;
    const auto b = static_cast<unsigned char>(text_[pos_]);
    if (b >= 0xF0) {
      len = 4;
    } else if (b >= 0xE0) {
      len = 3;
    } else if (b >= 0xC0) {
      len = 2;
    }
    const auto cps = decode_utf8(text_.substr(pos_, len));
    if (!cps || cps->size() != 1) throw std::runtime_error("reference: bad UTF-8 in grammar");
    pos_ += len;
    return (*cps)[0];
  }

  // --- matching ------------------------------------------------------------------------------
  Verdict match(std::string_view utf8) const {
    const auto cps = decode_utf8(utf8);
    if (!cps) throw std::runtime_error("reference: the text is not whole UTF-8");
    text_cps_ = &*cps;
    memo_.clear();
    const Result r = match_rule("root", 0);
    text_cps_ = nullptr;
    return {.whole = r.ends.contains(cps->size()), .prefix = r.runs_out};
  }

  Result match_rule(const std::string& name, size_t at) const {
    const auto key = std::pair(name, at);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    memo_[key] = {};  // a (left-recursive) cycle finds nothing
    Result r = match_node(*rules_.at(name), at);
    memo_[key] = r;
    return r;
  }

  bool class_matches(const Node& node, uint32_t cp) const {
    bool in = false;
    for (const auto& [lo, hi] : node.ranges) in |= cp >= lo && cp <= hi;
    return in != node.negated;
  }

  Result match_node(const Node& node, size_t at) const {
    const std::vector<uint32_t>& s = *text_cps_;
    const size_t n = s.size();
    Result r;
    switch (node.kind) {
      case Node::Kind::kAlternatives:
        for (const auto& child : node.children) {
          Result c = match_node(*child, at);
          r.ends.insert(c.ends.begin(), c.ends.end());
          r.runs_out |= c.runs_out;
        }
        return r;
      case Node::Kind::kSequence: {
        std::set<size_t> here = {at};
        for (const auto& child : node.children) {
          std::set<size_t> next;
          for (size_t p : here) {
            Result c = match_node(*child, p);
            next.insert(c.ends.begin(), c.ends.end());
            r.runs_out |= c.runs_out;
          }
          here = std::move(next);
        }
        r.ends = std::move(here);
        return r;
      }
      case Node::Kind::kLiteral: {
        size_t i = 0;
        while (i < node.literal.size() && at + i < n && s[at + i] == node.literal[i]) ++i;
        if (i == node.literal.size()) {
          r.ends.insert(at + i);
        } else if (at + i == n) {
          r.runs_out = true;  // the text ended inside the literal
        }
        return r;
      }
      case Node::Kind::kClass:
      case Node::Kind::kAny:
        if (at == n) {
          r.runs_out = true;
        } else if (node.kind == Node::Kind::kAny || class_matches(node, s[at])) {
          r.ends.insert(at + 1);
        }
        return r;
      case Node::Kind::kRule:
        return match_rule(node.rule, at);
      case Node::Kind::kRepeat: {
        const Node& item = *node.children[0];
        std::set<size_t> here = {at};
        if (node.min == 0) r.ends.insert(at);
        std::set<size_t> seen_after_min;
        for (int count = 1; node.max < 0 || count <= node.max; ++count) {
          std::set<size_t> next;
          for (size_t p : here) {
            Result c = match_node(item, p);
            next.insert(c.ends.begin(), c.ends.end());
            r.runs_out |= c.runs_out;
          }
          if (count >= node.min) {
            // Past the minimum, positions seen before add nothing new: stop when none is new.
            std::set<size_t> fresh;
            for (size_t p : next) {
              if (seen_after_min.insert(p).second) fresh.insert(p);
            }
            r.ends.insert(next.begin(), next.end());
            next = std::move(fresh);
          }
          if (next.empty()) break;
          here = std::move(next);
        }
        return r;
      }
    }
    return r;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, std::unique_ptr<Node>> rules_;
  mutable const std::vector<uint32_t>* text_cps_ = nullptr;
  mutable std::map<std::pair<std::string, size_t>, Result> memo_;
};

}  // namespace sieve::grammar::reference
