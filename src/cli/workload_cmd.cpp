// `flashdec workload`: runs workload cases, prints a table, and optionally
// writes JSON reports and an SVG trace (step latency and block usage).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flashdec.h"

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

void progress(void *, uint64_t done, uint64_t total) {
  std::fprintf(stderr, "\r  %3.0f%%",
               total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
  if (done >= total) std::fprintf(stderr, "\r      \r");
}

void print_table(const std::vector<Run> &runs) {
  std::printf("%-18s %-12s %6s %9s %9s %9s %9s %8s %6s %6s %6s %7s %6s\n", "case", "policy",
              "steps", "done", "p50_us", "p99_us", "tok/s", "stalled", "dead", "fcanc", "peak",
              "fair", "hits");
  for (const Run &r : runs) {
    const fd_workload_report &p = r.report;
    char done[32];
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
}

void write_json(FILE *f, const std::vector<Run> &runs) {
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    const fd_workload_report &p = runs[i].report;
    std::fprintf(
        f,
        "  {\"case\": \"%s\", \"policy\": \"%s\", \"seed\": %llu, \"steps\": %llu, "
        "\"executed_steps\": %llu, \"requests_submitted\": %llu, \"requests_completed\": %llu, "
        "\"completion_rate\": %.6f, \"useful_tokens\": %llu, \"generated_tokens\": %llu, "
        "\"tokens_per_second\": %.3f, \"step_latency_p50_us\": %.3f, \"step_latency_p90_us\": "
        "%.3f, \"step_latency_p99_us\": %.3f, \"stalled_steps\": %llu, \"backpressure_steps\": "
        "%llu, \"deadlocks\": %llu, \"forced_cancellations\": %llu, \"user_cancellations\": "
        "%llu, \"rejected_requests\": %llu, \"aborted_steps\": %llu, "
        "\"mean_admission_wait_steps\": %.3f, \"max_admission_wait_steps\": %llu, "
        "\"max_service_wait_steps\": %llu, \"fairness\": %.6f, \"max_blocks\": %u, "
        "\"peak_used_blocks\": %llu, \"mean_used_blocks\": %.3f, \"prefix_hits\": %llu, "
        "\"prefix_misses\": %llu, \"peak_saved_prefix_blocks\": %llu, \"trajectory_hash\": "
        "\"0x%016llx\"}%s\n",
        p.case_name, policy_name(p.policy), static_cast<unsigned long long>(p.seed),
        static_cast<unsigned long long>(p.steps), static_cast<unsigned long long>(p.executed_steps),
        static_cast<unsigned long long>(p.requests_submitted),
        static_cast<unsigned long long>(p.requests_completed), p.completion_rate,
        static_cast<unsigned long long>(p.useful_tokens),
        static_cast<unsigned long long>(p.generated_tokens), p.tokens_per_second,
        p.step_latency_p50_us, p.step_latency_p90_us, p.step_latency_p99_us,
        static_cast<unsigned long long>(p.stalled_steps),
        static_cast<unsigned long long>(p.backpressure_steps),
        static_cast<unsigned long long>(p.deadlocks),
        static_cast<unsigned long long>(p.forced_cancellations),
        static_cast<unsigned long long>(p.user_cancellations),
        static_cast<unsigned long long>(p.rejected_requests),
        static_cast<unsigned long long>(p.aborted_steps), p.mean_admission_wait_steps,
        static_cast<unsigned long long>(p.max_admission_wait_steps),
        static_cast<unsigned long long>(p.max_service_wait_steps), p.fairness, p.max_blocks,
        static_cast<unsigned long long>(p.peak_used_blocks), p.mean_used_blocks,
        static_cast<unsigned long long>(p.prefix_hits),
        static_cast<unsigned long long>(p.prefix_misses),
        static_cast<unsigned long long>(p.peak_saved_prefix_blocks),
        static_cast<unsigned long long>(p.trajectory_hash), i + 1 < runs.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
}

// One panel per run: step latency (line, left axis) and used blocks (area,
// right axis, as a fraction of the pool).
void write_svg(FILE *f, const std::vector<Run> &runs) {
  const int w = 760, h = 180, pad = 40;
  std::fprintf(f,
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n",
               w, static_cast<int>(runs.size()) * (h + 20) + 10);
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run &r = runs[i];
    const int y0 = static_cast<int>(i) * (h + 20) + 10;
    const size_t n = std::max<size_t>(r.trace.size(), 2);
    double lat_max = 1;
    for (const auto &p : r.trace) lat_max = std::max(lat_max, p.latency_us);
    const double pool = std::max<double>(r.report.max_blocks, 1);
    auto x = [&](size_t k) {
      return pad + (w - 2 * pad) * static_cast<double>(k) / static_cast<double>(n - 1);
    };
    std::fprintf(
        f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n",
        pad, y0, w - 2 * pad, h - 20);
    std::fprintf(f,
                 "<text x=\"%d\" y=\"%d\">%s / %s: blocks used (blue area, of %u), step latency "
                 "(red, max %.0f us)</text>\n",
                 pad, y0 + 12, r.report.case_name, policy_name(r.report.policy),
                 r.report.max_blocks, lat_max);
    std::string area = "M" + std::to_string(x(0)) + "," + std::to_string(y0 + h - 20);
    std::string line;
    for (size_t k = 0; k < r.trace.size(); ++k) {
      const double yb = y0 + (h - 20) * (1.0 - r.trace[k].used_blocks / pool);
      const double yl = y0 + (h - 20) * (1.0 - r.trace[k].latency_us / lat_max);
      area += " L" + std::to_string(x(k)) + "," + std::to_string(yb);
      line += (k == 0 ? "M" : " L") + std::to_string(x(k)) + "," + std::to_string(yl);
    }
    area += " L" + std::to_string(x(r.trace.empty() ? 0 : r.trace.size() - 1)) + "," +
            std::to_string(y0 + h - 20) + " Z";
    std::fprintf(f, "<path d=\"%s\" fill=\"#9ecae1\" stroke=\"none\"/>\n", area.c_str());
    if (!line.empty()) {
      std::fprintf(f, "<path d=\"%s\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1\"/>\n",
                   line.c_str());
    }
  }
  std::fprintf(f, "</svg>\n");
}

}  // namespace

int workload_command(int argc, char **argv) {
  if (argc < 1) {
    std::fprintf(stderr,
                 "usage: flashdec workload synthetic|scheduler|integrated [--case NAME] "
                 "[--seed N] [--threads N] [--json FILE] [--svg FILE]\n");
    return 2;
  }
  int32_t kind = -1;
  if (std::strcmp(argv[0], "synthetic") == 0) kind = FD_WORKLOAD_SYNTHETIC;
  if (std::strcmp(argv[0], "scheduler") == 0) kind = FD_WORKLOAD_SCHEDULER;
  if (std::strcmp(argv[0], "integrated") == 0) kind = FD_WORKLOAD_INTEGRATED;
  if (kind < 0) {
    std::fprintf(stderr, "flashdec workload: unknown kind '%s'\n", argv[0]);
    return 2;
  }
  const char *only = nullptr, *json = nullptr, *svg = nullptr;
  uint64_t seed = 0;
  uint32_t threads = 1;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--case") == 0 && has_value) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--seed") == 0 && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--threads") == 0 && has_value) {
      threads = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (std::strcmp(argv[i], "--json") == 0 && has_value) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--svg") == 0 && has_value) {
      svg = argv[++i];
    } else {
      std::fprintf(stderr, "flashdec workload: bad argument '%s'\n", argv[i]);
      return 2;
    }
  }
  std::vector<Run> runs;
  const char *name = nullptr;
  for (uint32_t c = 0; fd_workload_case_name(kind, c, &name) == FD_OK; ++c) {
    if (only != nullptr && std::strcmp(only, name) != 0) continue;
    std::fprintf(stderr, "running %s (seed %llu)\n", name, static_cast<unsigned long long>(seed));
    fd_workload_options o;
    fd_workload_options_init(&o);
    o.kind = kind;
    o.case_name = name;
    o.seed = seed;
    o.cpu_threads = threads;
    o.progress = progress;
    fd_workload_result *result = nullptr;
    const fd_status s = fd_workload_run(&o, &result);
    if (s != FD_OK) {
      std::fprintf(stderr, "flashdec workload %s: %s: %s\n", name, fd_status_string(s),
                   fd_last_error_message());
      return 1;
    }
    uint32_t count = 0;
    fd_workload_result_count(result, &count);
    for (uint32_t i = 0; i < count; ++i) {
      Run r;
      r.report.struct_size = sizeof r.report;
      fd_workload_result_report(result, i, &r.report);
      uint32_t n = 0;
      fd_workload_result_trace(result, i, nullptr, 0, &n);
      r.trace.resize(n);
      if (n != 0) fd_workload_result_trace(result, i, r.trace.data(), n, &n);
      runs.push_back(std::move(r));
    }
    fd_workload_result_destroy(result);
  }
  if (runs.empty()) {
    std::fprintf(stderr, "flashdec workload: no case named '%s'\n", only ? only : "");
    return 2;
  }
  print_table(runs);
  if (json != nullptr) {
    FILE *f = std::fopen(json, "w");
    if (f == nullptr) return std::perror(json), 1;
    write_json(f, runs);
    std::fclose(f);
  }
  if (svg != nullptr) {
    FILE *f = std::fopen(svg, "w");
    if (f == nullptr) return std::perror(svg), 1;
    write_svg(f, runs);
    std::fclose(f);
  }
  return 0;
}
