#pragma once
// Hand-written SVG line charts for the reports of `sieve bench-serve` and `sieve eval`: one
// panel = axes with round ticks, grid, title, axis labels and polylines with point markers.
#include <string>
#include <utility>
#include <vector>

namespace sieve::svg {

inline constexpr double kPanelWidth = 380, kPanelHeight = 300;
inline constexpr double kLeft = 64, kRight = 16, kTop = 40, kBottom = 48;  // margins inside a panel
inline constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c",
                                           "#ff7f0e", "#9467bd", "#8c564b"};

struct Line {
  std::string colour;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

// Text made safe for SVG/XML.
std::string escape(const std::string& text);

// One panel of kPanelWidth x kPanelHeight at (x0, y0); axes start at 0 (y always, x unless
// log2_x, which suits concurrency sweeps 1, 2, 4, ...).
std::string panel(double x0, double y0, const std::string& title, const std::string& x_label,
                  const std::string& y_label, const std::vector<Line>& lines, bool log2_x);

// The opening of a white document of the given size with a centred title; close with "</svg>".
std::string document_begin(double width, double height, const std::string& title);

// A legend entry at (x, y): a colour swatch (dashed or not) and its label.
std::string legend_entry(double x, double y, const std::string& colour, const std::string& label);

}  // namespace sieve::svg
