// `flashdec workload`: runs workload cases, prints a table, and optionally
// writes a JSON report and an SVG trace (step latency and block usage per
// run, drawn with svg_plot).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flashdec.h"
#include "svg_plot.hpp"

namespace {

const char *policy_name(int32_t p) {
  switch (p) {
    case FD_POLICY_UNSCHEDULED: return "unscheduled";
    case FD_POLICY_LIFETIME: return "lifetime";
    case FD_POLICY_GREEDY: return "greedy";
    case FD_POLICY_CANCEL_ON_BACKPRESSURE: return "cancel";
    default: return "?";
  }
}

struct Run {
  fd_workload_report report;
  std::vector<fd_workload_trace_point> trace;
};

// A progress bar on stderr (only when it is a terminal): whole cases count
// as equal shares, and inside a case the library's done/total; redrawn only
// when the bar moves by one of its 40 cells, or at most every 100 ms.
struct Progress {
  std::string label;
  size_t case_index = 0, cases = 1;
  int drawn = -1;
  std::chrono::steady_clock::time_point last{};

  static void callback(void *user, uint64_t done, uint64_t total) {
    static_cast<Progress *>(user)->update(
        total ? static_cast<double>(done) / static_cast<double>(total) : 1.0);
  }
  void update(double within) {
    const double frac =
        (static_cast<double>(case_index) + std::min(within, 1.0)) / static_cast<double>(cases);
    const int cells = static_cast<int>(frac * 40);
    const auto now = std::chrono::steady_clock::now();
    if (cells == drawn && now - last < std::chrono::milliseconds(100)) return;
    drawn = cells, last = now;
    std::fprintf(stderr, "\r[%-40.*s] %3.0f%%  %s\033[K", cells,
                 "########################################", 100 * frac, label.c_str());
    std::fflush(stderr);
  }
  static void clear() { std::fprintf(stderr, "\r\033[K"); }
};

const char *kLegend =
    "steps: iterations run; done: requests completed/submitted; p50_us, p99_us: step latency "
    "percentiles (us);\ntok/s: useful tokens per second of step time; stalled: iterations that "
    "ran no step; dead: deadlocks;\nfcanc: forced cancellations; peak: most KV blocks in use; "
    "fair: fairness (1 = equal service); hits: prefix-cache hits.";

void print_table(const std::vector<Run> &runs) {
  std::printf("%-18s %-12s %6s %9s %9s %9s %9s %8s %6s %6s %6s %7s %6s\n", "case", "policy",
              "steps", "done", "p50_us", "p99_us", "tok/s", "stalled", "dead", "fcanc", "peak",
              "fair", "hits");
  for (const Run &r : runs) {
    const fd_workload_report &p = r.report;
    char done[48];
    std::snprintf(done, sizeof done, "%llu/%llu",
                  static_cast<unsigned long long>(p.requests_completed),
                  static_cast<unsigned long long>(p.requests_submitted));
    std::printf("%-18s %-12s %6llu %9s %9.1f %9.1f %9.0f %8llu %6llu %6llu %6llu %7.3f %6llu\n",
                p.case_name, policy_name(p.policy), static_cast<unsigned long long>(p.steps), done,
                p.step_latency_p50_us, p.step_latency_p99_us, p.tokens_per_second,
                static_cast<unsigned long long>(p.stalled_steps),
                static_cast<unsigned long long>(p.deadlocks),
                static_cast<unsigned long long>(p.forced_cancellations),
                static_cast<unsigned long long>(p.peak_used_blocks), p.fairness,
                static_cast<unsigned long long>(p.prefix_hits));
  }
  std::printf("\n%s\n", kLegend);
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

nlohmann::ordered_json to_json(const std::vector<Run> &runs) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const Run &r : runs) {
    const fd_workload_report &p = r.report;
    nlohmann::ordered_json j;
    j["case"] = p.case_name;
    j["policy"] = policy_name(p.policy);
    j["seed"] = p.seed;
    j["steps"] = p.steps;
    j["executed_steps"] = p.executed_steps;
    j["requests_submitted"] = p.requests_submitted;
    j["requests_completed"] = p.requests_completed;
    j["completion_rate"] = p.completion_rate;
    j["useful_tokens"] = p.useful_tokens;
    j["generated_tokens"] = p.generated_tokens;
    j["tokens_per_second"] = p.tokens_per_second;
    j["step_latency_p50_us"] = p.step_latency_p50_us;
    j["step_latency_p90_us"] = p.step_latency_p90_us;
    j["step_latency_p99_us"] = p.step_latency_p99_us;
    j["stalled_steps"] = p.stalled_steps;
    j["backpressure_steps"] = p.backpressure_steps;
    j["deadlocks"] = p.deadlocks;
    j["forced_cancellations"] = p.forced_cancellations;
    j["user_cancellations"] = p.user_cancellations;
    j["rejected_requests"] = p.rejected_requests;
    j["aborted_steps"] = p.aborted_steps;
    j["mean_admission_wait_steps"] = p.mean_admission_wait_steps;
    j["max_admission_wait_steps"] = p.max_admission_wait_steps;
    j["max_service_wait_steps"] = p.max_service_wait_steps;
    j["fairness"] = p.fairness;
    j["max_blocks"] = p.max_blocks;
    j["peak_used_blocks"] = p.peak_used_blocks;
    j["mean_used_blocks"] = p.mean_used_blocks;
    j["prefix_hits"] = p.prefix_hits;
    j["prefix_misses"] = p.prefix_misses;
    j["peak_saved_prefix_blocks"] = p.peak_saved_prefix_blocks;
    j["trajectory_hash"] = hex64(p.trajectory_hash);
    all.push_back(std::move(j));
  }
  return all;
}

// One panel per run: KV blocks in use (area, right axis, up to the pool
// size) and step latency (line, left axis) against the iteration.
std::string trace_svg(const std::vector<Run> &runs, uint64_t seed) {
  fd_plot::Figure fig;
  fig.title = "flashdec workload trace";
  fig.note = "seed " + std::to_string(seed) +
             "; one panel per case and policy; iterations that ran no step plot as 0 us";
  for (const Run &r : runs) {
    fd_plot::Panel p;
    p.title = std::string(r.report.case_name) + " / " + policy_name(r.report.policy) + ": " +
              std::to_string(r.report.requests_completed) + " of " +
              std::to_string(r.report.requests_submitted) + " requests done";
    p.x.label = "iteration (step number)";
    p.y.label = "step latency (us)";
    p.y2.label = "KV blocks in use";
    p.y2.max = std::max<double>(r.report.max_blocks, 1);
    fd_plot::Series blocks{
        "KV blocks in use (right axis, pool of " + std::to_string(r.report.max_blocks) + ")",
        "#6baed6",
        {},
        {},
        true,
        true};
    fd_plot::Series lat{"step latency (left axis)", "#d62728", {}, {}, false, false};
    for (const fd_workload_trace_point &t : r.trace) {
      blocks.x.push_back(static_cast<double>(t.step));
      blocks.y.push_back(t.used_blocks);
      lat.x.push_back(static_cast<double>(t.step));
      lat.y.push_back(t.latency_us);
    }
    p.series.push_back(std::move(blocks));
    p.series.push_back(std::move(lat));
    fig.panels.push_back(std::move(p));
  }
  return fd_plot::render(fig);
}

struct Options {
  std::string kind, only, json, svg;
  uint64_t seed = 0;
  uint32_t threads = 1;
};

int run(const Options &opt) {
  int32_t kind = FD_WORKLOAD_SCHEDULER;
  if (opt.kind == "synthetic") kind = FD_WORKLOAD_SYNTHETIC;
  if (opt.kind == "integrated") kind = FD_WORKLOAD_INTEGRATED;
  std::vector<std::string> names;
  const char *name = nullptr;
  for (uint32_t c = 0; fd_workload_case_name(kind, c, &name) == FD_OK; ++c) names.push_back(name);
  std::vector<std::string> chosen;
  for (const std::string &n : names)
    if (opt.only.empty() || n == opt.only) chosen.push_back(n);
  if (chosen.empty()) {
    std::string list;
    for (const std::string &n : names) list += (list.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "flashdec workload: --case: no %s case named '%s' (cases: %s)\n",
                 opt.kind.c_str(), opt.only.c_str(), list.c_str());
    return 2;
  }
  std::vector<Run> runs;
  Progress progress;
  progress.cases = chosen.size();
  const bool show = progress_wanted();
  for (size_t i = 0; i < chosen.size(); ++i) {
    progress.case_index = i;
    progress.label = chosen[i] + " (case " + std::to_string(i + 1) + " of " +
                     std::to_string(chosen.size()) + ", seed " + std::to_string(opt.seed) + ")";
    if (show) progress.update(0);
    fd_workload_options o;
    fd_workload_options_init(&o);
    o.kind = kind;
    o.case_name = chosen[i].c_str();
    o.seed = opt.seed;
    o.cpu_threads = opt.threads;
    o.progress = show ? Progress::callback : nullptr;
    o.progress_user_data = &progress;
    fd_workload_result *result = nullptr;
    const fd_status s = fd_workload_run(&o, &result);
    if (s != FD_OK) {
      if (show) Progress::clear();
      std::fprintf(stderr, "flashdec workload %s: %s: %s\n", chosen[i].c_str(), fd_status_string(s),
                   fd_last_error_message());
      return 1;
    }
    uint32_t count = 0;
    fd_workload_result_count(result, &count);
    for (uint32_t k = 0; k < count; ++k) {
      Run r;
      r.report.struct_size = sizeof r.report;
      fd_workload_result_report(result, k, &r.report);
      uint32_t n = 0;
      fd_workload_result_trace(result, k, nullptr, 0, &n);
      r.trace.resize(n);
      if (n != 0) fd_workload_result_trace(result, k, r.trace.data(), n, &n);
      runs.push_back(std::move(r));
    }
    fd_workload_result_destroy(result);
  }
  if (show) Progress::clear();
  print_table(runs);
  std::string error;
  if (!opt.json.empty() && !fd_plot::write_file(opt.json, to_json(runs).dump(2) + "\n", &error)) {
    std::fprintf(stderr, "flashdec workload: --json: %s\n", error.c_str());
    return 1;
  }
  if (!opt.svg.empty() && !fd_plot::write_file(opt.svg, trace_svg(runs, opt.seed), &error)) {
    std::fprintf(stderr, "flashdec workload: --svg: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CommandRun add_workload_command(CLI::App &root) {
  auto opt = std::make_shared<Options>();
  CLI::App *sub = root.add_subcommand(
      "workload", "run the built-in serving workloads (CPU backend) and report each policy");
  sub->add_option("kind", opt->kind, "workload family")
      ->required()
      ->check(CLI::IsMember({"synthetic", "scheduler", "integrated"}));
  sub->add_option("--case", opt->only, "run only the case of this name (default: every case)");
  sub->add_option("--seed", opt->seed, "seed of every random choice (0 .. 2^64-1)")
      ->default_val(0)
      ->check(whole_number(0, UINT64_MAX));
  sub->add_option("--threads", opt->threads, "decode threads per step (1 .. 1024)")
      ->default_val(1)
      ->check(whole_number(1, 1024));
  sub->add_option("--json", opt->json, "write the reports as a JSON array to FILE")
      ->check(writable_file());
  sub->add_option("--svg", opt->svg,
                  "write a trace plot to FILE: per run, step latency and KV blocks in use "
                  "against the iteration")
      ->check(writable_file());
  sub->footer(std::string("Table columns:\n") + kLegend);
  return [opt] { return run(*opt); };
}
