#include "grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "util/error.h"
#include "util/utf8.h"

namespace sieve::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;
constexpr uint64_t kMaxRepeat = 100000;
// Groups ( ... ) inside groups: each level is a nested call of the parser.
constexpr int kMaxGroupNesting = 256;

// Sorts and merges ranges, then removes the surrogates.
std::vector<CharRange> normalize(std::vector<CharRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  std::vector<CharRange> merged;
  for (const CharRange& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  std::vector<CharRange> out;
  for (const CharRange& r : merged) {
    if (r.hi < kSurrogateLo || r.lo > kSurrogateHi) {
      out.push_back(r);
      continue;
    }
    if (r.lo < kSurrogateLo) out.push_back({r.lo, kSurrogateLo - 1});
    if (r.hi > kSurrogateHi) out.push_back({kSurrogateHi + 1, r.hi});
  }
  return out;
}

std::vector<CharRange> complement(const std::vector<CharRange>& ranges) {
  std::vector<CharRange> out;
  uint32_t next = 0;
  for (const CharRange& r : ranges) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize(std::move(out));
}

Element chars(std::vector<CharRange> ranges) {
  Element e;
  e.kind = Element::Kind::kChars;
  e.ranges = std::move(ranges);
  return e;
}

Element rule_ref(uint32_t idx) {
  Element e;
  e.kind = Element::Kind::kRule;
  e.rule_idx = idx;
  return e;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Grammar parse() {
    skip_space();
    if (eof()) fail_here("empty grammar: expected a rule such as `root ::= \"text\"`");
    while (!eof()) {
      parse_rule();
      skip_space();
    }
    for (size_t i = 0; i < grammar_.rules.size(); ++i) {
      if (!defined_[i]) {
        fail_at(first_use_[i], fmt::format("undefined rule '{}'", grammar_.rules[i].name));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) fail("grammar: no rule named 'root' (the text starts there)");
    grammar_.root_idx = root->second;
    return std::move(grammar_);
  }

 private:
  bool eof() const { return pos_ >= src_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0';
  }

  [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
    size_t line = 1;
    size_t col = 1;
    for (size_t i = 0; i < pos && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("grammar:{}:{}: {}", line, col, what);
  }
  [[noreturn]] void fail_here(const std::string& what) const { fail_at(pos_, what); }

  void skip_space() {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail_here("expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  // At `name ::=`? (does not move)
  bool at_rule_start() {
    const size_t saved = pos_;
    while (!eof() && is_name_char(peek())) ++pos_;
    bool found = pos_ > saved;
    if (found) {
      while (peek() == ' ' || peek() == '\t') ++pos_;
      found = src_.substr(pos_, 3) == "::=";
    }
    pos_ = saved;
    return found;
  }

  uint32_t rule_id(const std::string& name, size_t use_pos) {
    auto [it, inserted] = ids_.emplace(name, static_cast<uint32_t>(grammar_.rules.size()));
    if (inserted) {
      grammar_.rules.push_back(Rule{name, {}});
      defined_.push_back(false);
      first_use_.push_back(use_pos);
    }
    return it->second;
  }

  uint32_t new_rule(const std::string& owner, std::vector<Sequence> alternatives) {
    std::string name;
    do {
      name = fmt::format("{}-{}", owner, ++num_generated_);
    } while (ids_.contains(name));
    const uint32_t id = rule_id(name, pos_);
    defined_[id] = true;
    grammar_.rules[id].alternatives = std::move(alternatives);
    return id;
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string name = parse_name();
    while (peek() == ' ' || peek() == '\t') ++pos_;
    if (src_.substr(pos_, 3) != "::=") fail_here(fmt::format("expected '::=' after '{}'", name));
    pos_ += 3;
    const uint32_t id = rule_id(name, start);
    if (defined_[id]) fail_at(start, fmt::format("rule '{}' is defined twice", name));
    defined_[id] = true;
    auto alternatives = parse_alternatives(name, /*top_level=*/true);
    grammar_.rules[id].alternatives = std::move(alternatives);
  }

  std::vector<Sequence> parse_alternatives(const std::string& owner, bool top_level) {
    std::vector<Sequence> alternatives;
    alternatives.push_back(parse_sequence(owner, top_level));
    while (peek() == '|') {
      ++pos_;
      alternatives.push_back(parse_sequence(owner, top_level));
    }
    return alternatives;
  }

  Sequence parse_sequence(const std::string& owner, bool top_level) {
    Sequence seq;
    for (;;) {
      skip_space();
      if (eof() || peek() == '|' || peek() == ')') break;
      if (top_level && at_rule_start()) break;
      const size_t atom_begin = seq.size();
      parse_atom(owner, seq);
      for (;;) {
        skip_space();
        const char c = peek();
        if (c != '*' && c != '+' && c != '?' && c != '{') break;
        apply_repetition(owner, seq, atom_begin);
      }
    }
    return seq;
  }

  void parse_atom(const std::string& owner, Sequence& seq) {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      while (peek() != '"') {
        if (eof() || peek() == '\n') fail_here("unterminated string literal");
        seq.push_back(chars({{parse_char(), 0}}));
        seq.back().ranges[0].hi = seq.back().ranges[0].lo;
      }
      ++pos_;
    } else if (c == '[') {
      seq.push_back(chars(parse_class()));
    } else if (c == '.') {
      ++pos_;
      seq.push_back(chars(normalize({{0, kMaxCodePoint}})));
    } else if (c == '(') {
      const size_t open = pos_;
      if (group_depth_ >= kMaxGroupNesting) {
        fail_here(fmt::format("groups nest deeper than {} levels", kMaxGroupNesting));
      }
      ++pos_;
      ++group_depth_;
      auto alternatives = parse_alternatives(owner, /*top_level=*/false);
      --group_depth_;
      skip_space();
      if (peek() != ')') fail_at(open, "unclosed '(' (expected ')')");
      ++pos_;
      if (alternatives.size() == 1) {
        for (Element& e : alternatives[0]) seq.push_back(std::move(e));
      } else {
        seq.push_back(rule_ref(new_rule(owner, std::move(alternatives))));
      }
    } else if (is_name_char(c)) {
      const size_t start = pos_;
      const std::string name = parse_name();
      seq.push_back(rule_ref(rule_id(name, start)));
    } else {
      fail_here(fmt::format("unexpected '{}'", c));
    }
  }

  uint64_t parse_count() {
    const size_t start = pos_;
    uint64_t n = 0;
    while (peek() >= '0' && peek() <= '9') {
      n = n * 10 + static_cast<uint64_t>(peek() - '0');
      if (n > kMaxRepeat) fail_at(start, fmt::format("repetition count over {}", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) fail_here("expected a number");
    return n;
  }

  // Replaces seq[atom_begin..] (the item just parsed) with its repetition.
  void apply_repetition(const std::string& owner, Sequence& seq, size_t atom_begin) {
    const size_t op_pos = pos_;
    if (atom_begin == seq.size()) fail_here("repetition of nothing");
    uint64_t min = 0;
    std::optional<uint64_t> max;
    const char op = peek();
    ++pos_;
    if (op == '*') {
    } else if (op == '+') {
      min = 1;
    } else if (op == '?') {
      max = 1;
    } else {  // {m}, {m,}, {m,n}
      skip_space();
      min = parse_count();
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
        if (peek() != '}') max = parse_count();
      } else {
        max = min;
      }
      skip_space();
      if (peek() != '}') fail_here("expected '}' to close the repetition");
      ++pos_;
      if (max && *max < min) fail_at(op_pos, "repetition {m,n} with n < m");
    }
    Sequence atom(seq.begin() + static_cast<ptrdiff_t>(atom_begin), seq.end());
    seq.resize(atom_begin);
    if (atom.size() > 1) {
      atom = {rule_ref(new_rule(owner, {std::move(atom)}))};
    }
    const Element& x = atom[0];
    for (uint64_t i = 0; i < min; ++i) seq.push_back(x);
    if (!max) {  // x*: r ::= x r |
      const uint32_t r = new_rule(owner, {});
      grammar_.rules[r].alternatives = {{x, rule_ref(r)}, {}};
      seq.push_back(rule_ref(r));
    } else if (*max > min) {  // (x (x ...)?)?: r_1 ::= x r_2 | ... r_k ::= x |
      std::optional<uint32_t> inner;
      for (uint64_t i = min; i < *max; ++i) {
        Sequence with = {x};
        if (inner) with.push_back(rule_ref(*inner));
        inner = new_rule(owner, {std::move(with), {}});
      }
      seq.push_back(rule_ref(*inner));
    }
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail_here(fmt::format("expected {} hex digits", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class, escapes decoded.
  uint32_t parse_char() {
    const size_t start = pos_;
    const auto byte = static_cast<uint8_t>(peek());
    if (byte == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      uint32_t cp = 0;
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '/':
        case '^':
          return static_cast<uint8_t>(e);
        case 'x':
          cp = parse_hex(2);
          break;
        case 'u':
          cp = parse_hex(4);
          break;
        case 'U':
          cp = parse_hex(8);
          break;
        default:
          fail_at(start, fmt::format("unknown escape '\\{}'", e));
      }
      if (cp > kMaxCodePoint || (cp >= kSurrogateLo && cp <= kSurrogateHi)) {
        fail_at(start, fmt::format("escape U+{:04X} is not a Unicode scalar value", cp));
      }
      return cp;
    }
    // Raw UTF-8.
    size_t len = 1;
    uint32_t cp = byte;
    if (byte >= 0xF0 && byte <= 0xF4) {
      len = 4;
      cp = byte & 0x07;
    } else if (byte >= 0xE0) {
      len = 3;
      cp = byte & 0x0F;
    } else if (byte >= 0xC2 && byte < 0xE0) {
      len = 2;
      cp = byte & 0x1F;
    } else if (byte >= 0x80) {
      fail_here("invalid UTF-8");
    }
    if (len > 1 && byte >= 0xF5) fail_here("invalid UTF-8");
    for (size_t i = 1; i < len; ++i) {
      const auto b = static_cast<uint8_t>(peek(i));
      if ((b & 0xC0) != 0x80) fail_here("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > kMaxCodePoint ||
        (cp >= kSurrogateLo && cp <= kSurrogateHi)) {
      fail_here("invalid UTF-8");
    }
    pos_ += len;
    return cp;
  }

  std::vector<CharRange> parse_class() {
    const size_t open = pos_;
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CharRange> ranges;
    while (peek() != ']') {
      if (eof() || peek() == '\n') fail_at(open, "unterminated character class (expected ']')");
      const size_t item = pos_;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail_at(item, "character range with its end before its start");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    ranges = normalize(std::move(ranges));
    if (negated) ranges = complement(ranges);
    if (ranges.empty()) fail_at(open, "character class matches nothing");
    return ranges;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int group_depth_ = 0;  // groups open at pos_
  Grammar grammar_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  uint32_t num_generated_ = 0;
};

void append_char(std::string& out, uint32_t cp, bool in_class) {
  switch (cp) {
    case '\n':
      out += "\\n";
      return;
    case '\r':
      out += "\\r";
      return;
    case '\t':
      out += "\\t";
      return;
    case '\\':
      out += "\\\\";
      return;
    case '"':
      out += "\\\"";
      return;
    default:
      break;
  }
  if (in_class && (cp == ']' || cp == '-' || cp == '^' || cp == '[')) {
    out += '\\';
    out += static_cast<char>(cp);
  } else if (cp < 0x20 || cp == 0x7F) {
    out += fmt::format("\\x{:02X}", cp);
  } else if (cp >= 0x80 && cp <= 0x9F) {
    out += fmt::format("\\u{:04X}", cp);
  } else {
    append_utf8(out, cp);
  }
}

bool is_single(const Element& e) {
  return e.kind == Element::Kind::kChars && e.ranges.size() == 1 &&
         e.ranges[0].lo == e.ranges[0].hi;
}

}  // namespace

Grammar parse_gbnf(std::string_view text) {
  Grammar grammar = Parser(text).parse();
  check_grammar(grammar);
  return grammar;
}

std::string escape_gbnf_literal(std::string_view utf8) {
  // Decoding is lenient here: callers pass valid UTF-8 (JSON text).
  std::string out;
  size_t i = 0;
  while (i < utf8.size()) {
    const auto b = static_cast<uint8_t>(utf8[i]);
    uint32_t cp = b;
    size_t len = 1;
    if (b >= 0xF0) {
      len = 4;
      cp = b & 0x07;
    } else if (b >= 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if (b >= 0xC0) {
      len = 2;
      cp = b & 0x1F;
    }
    for (size_t k = 1; k < len && i + k < utf8.size(); ++k) {
      cp = (cp << 6) | (static_cast<uint8_t>(utf8[i + k]) & 0x3F);
    }
    i += len;
    append_char(out, cp, /*in_class=*/false);
  }
  return out;
}

std::string to_gbnf(const Grammar& grammar) {
  std::string out;
  for (const Rule& rule : grammar.rules) {
    out += rule.name + " ::=";
    for (size_t a = 0; a < rule.alternatives.size(); ++a) {
      if (a > 0) out += " |";
      const Sequence& seq = rule.alternatives[a];
      if (seq.empty()) out += " \"\"";
      for (size_t i = 0; i < seq.size(); ++i) {
        const Element& e = seq[i];
        if (e.kind == Element::Kind::kRule) {
          out += " " + grammar.rules[e.rule_idx].name;
        } else if (is_single(e)) {
          out += " \"";
          for (; i < seq.size() && is_single(seq[i]); ++i) {
            append_char(out, seq[i].ranges[0].lo, false);
          }
          --i;
          out += "\"";
        } else {
          out += " [";
          for (const CharRange& r : e.ranges) {
            append_char(out, r.lo, true);
            if (r.hi != r.lo) {
              out += '-';
              append_char(out, r.hi, true);
            }
          }
          out += "]";
        }
      }
    }
    out += "\n";
  }
  return out;
}

void check_grammar(const Grammar& grammar) {
  // Every walk here is a loop over explicit worklists: a grammar of 10^5 rules that each name the
  // next one must not take quadratic time or overflow the stack.
  const size_t num_rules = grammar.rules.size();
  // Where each rule is used: (user rule, alternative) for every element naming it.
  struct Use {
    uint32_t rule, alt;
  };
  std::vector<std::vector<Use>> uses(num_rules);
  // Per (rule, alternative): how many of its elements are not known nullable yet, and how many
  // are not known to finish yet (characters always finish, never match the empty text).
  std::vector<std::vector<uint32_t>> not_nullable(num_rules), not_finishing(num_rules);
  std::vector<bool> nullable(num_rules, false);
  std::vector<bool> finishes(num_rules, false);
  std::vector<uint32_t> nullable_work, finish_work;
  // A rule whose alternative has no open element left is known (nullable, or finishing).
  const auto settle = [](uint32_t r, uint32_t open, std::vector<bool>& known,
                         std::vector<uint32_t>& work) {
    if (open == 0 && !known[r]) {
      known[r] = true;
      work.push_back(r);
    }
  };
  for (uint32_t r = 0; r < num_rules; ++r) {
    const auto& alternatives = grammar.rules[r].alternatives;
    not_nullable[r].resize(alternatives.size());
    not_finishing[r].resize(alternatives.size());
    for (uint32_t a = 0; a < alternatives.size(); ++a) {
      uint32_t open_nullable = 0, open_finishing = 0;
      for (const Element& e : alternatives[a]) {
        ++open_nullable;  // a character never matches the empty text: stays counted
        if (e.kind == Element::Kind::kRule) {
          ++open_finishing;
          uses[e.rule_idx].push_back({r, a});
        }
      }
      not_nullable[r][a] = open_nullable;
      not_finishing[r][a] = open_finishing;
      settle(r, open_nullable, nullable, nullable_work);
      settle(r, open_finishing, finishes, finish_work);
    }
  }
  // A rule that became known counts down each alternative using it; an alternative at zero makes
  // its rule known. An element naming the rule twice counts twice.
  const auto propagate = [&](std::vector<uint32_t>& work, std::vector<std::vector<uint32_t>>& open,
                             std::vector<bool>& known) {
    while (!work.empty()) {
      const uint32_t s = work.back();
      work.pop_back();
      for (const Use& u : uses[s]) settle(u.rule, --open[u.rule][u.alt], known, work);
    }
  };
  propagate(nullable_work, not_nullable, nullable);
  propagate(finish_work, not_finishing, finishes);
  for (size_t r = 0; r < num_rules; ++r) {
    if (!finishes[r]) {
      fail(
          "grammar: rule '{}' can never finish (each of its alternatives needs the rule itself "
          "again); give it an alternative without the recursion",
          grammar.rules[r].name);
    }
  }
  // Left recursion: an edge r -> s when s can be entered before r has consumed a character.
  std::vector<std::vector<uint32_t>> left(num_rules);
  for (size_t r = 0; r < num_rules; ++r) {
    for (const Sequence& seq : grammar.rules[r].alternatives) {
      for (const Element& e : seq) {
        if (e.kind != Element::Kind::kRule) break;
        left[r].push_back(e.rule_idx);
        if (!nullable[e.rule_idx]) break;
      }
    }
  }
  // Depth-first, the path and each rule's next edge on an explicit stack.
  std::vector<uint8_t> color(num_rules, 0);  // 0 new, 1 on the path, 2 done
  struct Visit {
    uint32_t rule;
    size_t next_edge;
  };
  std::vector<Visit> path;
  for (uint32_t root = 0; root < num_rules; ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    path.push_back({root, 0});
    while (!path.empty()) {
      Visit& top = path.back();
      if (top.next_edge == left[top.rule].size()) {
        color[top.rule] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t s = left[top.rule][top.next_edge++];
      if (color[s] == 1) {
        std::string cycle;
        auto it =
            std::find_if(path.begin(), path.end(), [&](const Visit& v) { return v.rule == s; });
        for (; it != path.end(); ++it) cycle += grammar.rules[it->rule].name + " -> ";
        cycle += grammar.rules[s].name;
        fail(
            "grammar: left recursion ({}): a rule reaches itself before consuming a character "
            "(possibly through rules that match nothing, or a repetition of something that may "
            "be empty); rewrite it with repetition, e.g. `x (\",\" x)*`",
            cycle);
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.push_back({s, 0});
      }
    }
  }
}

}  // namespace sieve::grammar
