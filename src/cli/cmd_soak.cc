// `sieve soak`: many streaming clients against a running server for a while, normal greedy
// requests of every kind mixed (with --abuse on) with disconnects, cancellations, slow readers,
// malformed requests and slow-loris connections; counts outcomes and checks that nothing was
// lost. bench/soak.sh starts a server and runs it with and without abuse. The soak is in
// loadgen/soak.h.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "loadgen/soak.h"
#include "util/error.h"

namespace sieve::cli {

namespace {

struct SoakOptions {
  loadgen::SoakConfig config;
  std::string abuse = "on";
  std::string out_path;
};

void soak(SoakOptions options) {
  options.config.abuse = options.abuse == "on";
  const loadgen::SoakReport report = loadgen::run_soak(options.config);
  fmt::print("{}", loadgen::format_soak_report(options.config, report));
  std::fflush(stdout);
  if (!options.out_path.empty()) {
    std::ofstream out(options.out_path);
    out << loadgen::soak_report_json(options.config, report).dump(2) << "\n";
    if (!out) fail("failed writing '{}'", options.out_path);
  }
  if (!report.failures().empty()) fail("the soak failed (see the result above)");
}

}  // namespace

void add_soak_command(CLI::App& app) {
  auto options = std::make_shared<SoakOptions>();
  loadgen::SoakConfig& c = options->config;
  CLI::App* command = app.add_subcommand(
      "soak",
      "Soak a running server: streaming clients of every request kind, with or without abuse "
      "(disconnects, slow readers, malformed bodies, slow-loris); fails on lost or wrong output");
  command->add_option("--base-url", c.base_url, "Server URL, e.g. http://127.0.0.1:8080")
      ->required();
  command->add_option("--api-key", c.api_key, "Sent as 'Authorization: Bearer KEY'");
  command->add_option("--duration", c.duration_s, "Seconds of load")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--clients", c.num_clients, "Concurrent streaming clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--abuse", options->abuse,
                   "on: 30% of the clients' requests misbehave, plus slow readers and slow-loris "
                   "connections; off: normal requests only")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  command
      ->add_option("--slow-loris", c.num_slow_loris,
                   "Connections that trickle a request body, one byte per --slow-loris-interval")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--slow-loris-interval", c.slow_loris_interval_s,
                   "Seconds between two bytes of a slow-loris body")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--slow-readers", c.num_slow_readers,
                   "Clients that read their stream at --slow-reader-rate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--slow-reader-rate", c.slow_reader_bytes_per_s,
                   "Bytes per second a slow reader reads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", c.seed, "Seed of the clients' choices")->capture_default_str();
  command
      ->add_option("--request-timeout", c.request_timeout_s,
                   "Seconds a normal request may take before it counts as failed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--settle-timeout", c.settle_timeout_s,
                   "Seconds to wait after the load for the server to release every KV page")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--out", options->out_path, "JSON file with the report");
  command->callback([options] { soak(*options); });
}

}  // namespace sieve::cli
