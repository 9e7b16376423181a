#include "tools/src/perf_report.hpp"

#include <unistd.h>
#include <algorithm>
#include <cstdlib>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "rdmacc/config.hpp"
#include "rdmacc/environment.hpp"
#include "rdmacc/error.hpp"
#include "rdmacc/version.hpp"

namespace rdmacc::perf {
namespace {

constexpr const char* kCsvHeader =
    "collective,ranks,dtype,op,algorithm,size_bytes,count,in_place,time_us,algbw_gbs,busbw_gbs,"
    "wrong,registered,blocking,buffers";
constexpr size_t kCsvColumns = 15;

std::vector<std::string> splitCsv(const std::string& line) {
  std::vector<std::string> cells;
  size_t start = 0;
  for (size_t comma; (comma = line.find(',', start)) != std::string::npos; start = comma + 1)
    cells.push_back(line.substr(start, comma - start));
  cells.push_back(line.substr(start));
  return cells;
}

}  // namespace

std::string cell(const Row* r) {
  if (r == nullptr) return fmt::format(" {:>8} {:>7} {:>7} {:>6}", "n/a", "", "", "");
  // Two decimals, as nccl-tests: a shared-memory allreduce of 0.16 us is not 0.2.
  return fmt::format(" {:>8.2f} {:>7.3f} {:>7.3f} {:>6}", r->time, r->algbw, r->busbw, r->wrong);
}

// ---------------------------------------------------------- CSV and plot --

void appendCsv(const std::string& path, const Args& args, int ranks, const std::vector<Row>& rows) {
  bool fresh = true;
  if (std::ifstream in(path); in) {
    fresh = in.peek() == std::ifstream::traits_type::eof();
    // Rows under another header would be misread by --replot.
    if (std::string header; !fresh && (!std::getline(in, header) || header != kCsvHeader)) {
      throw Error(
          ErrorKind::InvalidArgument,
          fmt::format("{} has other columns than this rdmacc-perf writes ({})", path, kCsvHeader),
          "write to a new file (an older rdmacc-perf wrote this one)");
    }
  }
  std::ofstream out(path, std::ios::app);
  if (fresh) out << kCsvHeader << "\n";
  for (const Row& r : rows) {
    out << fmt::format("{},{},{},{},{},{},{},{},{:.3f},{:.6f},{:.6f},{},{},{},{}\n",
                       args.collective, ranks, toString(args.dtype), toString(args.op),
                       toString(args.algorithm), r.bytes, r.count, r.inPlace ? 1 : 0, r.time,
                       r.algbw, r.busbw, r.wrong, args.registerBuffers ? 1 : 0,
                       args.blocking ? 1 : 0, args.buffers);
  }
  if (!out) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("cannot write {}", path),
                "check the directory exists and is writable");
  }
}

// One line per (collective, ranks, algorithm, registered, blocking,
// buffers): busbw and time against size.
// Out-of-place rows where a collective has them (nccl-tests' first columns).
void plotCsv(const std::string& csvPath, const std::string& png, double refBusbw, double refTime) {
  std::ifstream in(csvPath);
  std::string line;
  if (!std::getline(in, line) || line != kCsvHeader) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} is not an rdmacc-perf CSV file", csvPath),
                "write it with rdmacc-perf --csv");
  }
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::vector<std::string>>>
      series;                          // key->place->rows
  std::map<std::string, int> ranksOf;  // key -> world size
  std::vector<int> worldSizes;         // one row of panels each, ascending
  while (std::getline(in, line)) {
    auto c = splitCsv(line);
    if (c.size() != kCsvColumns || c[5] == "0") continue;
    std::string key =
        fmt::format("{} {} ranks{}{}{}{}", c[0], c[1], c[4] == "auto" ? std::string() : " " + c[4],
                    c[12] == "1" ? " registered" : "", c[13] == "1" ? " blocking" : "",
                    c[14] == "1" ? std::string() : fmt::format(" {} buffers", c[14]));
    if (!series.count(key)) {
      order.push_back(key);
      ranksOf[key] = std::atoi(c[1].c_str());
      if (std::find(worldSizes.begin(), worldSizes.end(), ranksOf[key]) == worldSizes.end())
        worldSizes.push_back(ranksOf[key]);
    }
    series[key][c[7]].push_back(fmt::format("{} {} {}", c[5], c[10], c[8]));
  }
  if (order.empty())
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} has no rows", csvPath));
  std::sort(worldSizes.begin(), worldSizes.end());
  std::string dataPath = png + ".dat", scriptPath = png + ".gp";
  {
    std::ofstream data(dataPath);
    for (const auto& key : order) {
      auto& places = series[key];
      auto& rows = places.count("0") ? places["0"] : places["1"];
      data << "# " << key << "\n";
      for (const auto& r : rows) data << r << "\n";
      data << "\n\n";
    }
    // One row of panels per world size (busbw | time), the legend under
    // each panel rather than over its lines.
    std::ofstream gp(scriptPath);
    gp << fmt::format("set terminal pngcairo size 1400,{} font ',10' noenhanced\n",
                      std::max<size_t>(1, worldSizes.size()) * 520)
       << "set output '" << png << "'\n"
       << fmt::format("set multiplot layout {},2 title 'rdmacc-perf'\n", worldSizes.size())
       << "set logscale x 2\nset format x '%.0b%B'\nset xlabel 'size (bytes)'\n"
       << "set grid\nset key below maxrows 4\n";
    // A reference value as a dashed horizontal line across the panel.
    auto reference = [&](double value, const char* what) {
      return value > 0
                 ? fmt::format("{} with lines dashtype 2 lw 2 lc rgb 'black' title '{} ({:.4g})'",
                               value, what, value)
                 : std::string();
    };
    auto plotAll = [&](int ranks, int column) {
      gp << "plot ";
      bool first = true;
      if (auto ref = column == 2
                         ? reference(refBusbw, "reference: ib_write_bw -b per direction, GB/s")
                         : reference(refTime, "reference: ib_write_lat, us");
          !ref.empty()) {
        gp << ref;
        first = false;
      }
      for (size_t i = 0; i < order.size(); ++i) {
        if (ranksOf[order[i]] != ranks) continue;
        gp << (first ? "" : ", ") << "'" << dataPath << "' index " << i << " using 1:" << column
           << " with linespoints title '" << order[i] << "'";
        first = false;
      }
      gp << "\n";
    };
    for (int ranks : worldSizes) {
      gp << fmt::format("set title '{} ranks: bus bandwidth'\n", ranks)
         << "unset logscale y\nset ylabel 'busbw (GB/s)'\n";
      plotAll(ranks, 2);
      gp << fmt::format("set title '{} ranks: time'\n", ranks)
         << "set logscale y 10\nset ylabel 'time (us)'\n";
      plotAll(ranks, 3);
    }
    gp << "unset multiplot\n";
  }
  std::string command = fmt::format("gnuplot '{}' 2>&1", scriptPath);
  int status = std::system(command.c_str());
  std::remove(dataPath.c_str());
  std::remove(scriptPath.c_str());
  if (status != 0) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("gnuplot failed to draw {}", png),
                "install gnuplot (apt-get install gnuplot-nox), or plot the --csv file yourself");
  }
  fmt::print("# plot: {}\n", png);
}

std::string isoNow() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// --json: what nccl-tests' -J has (the command, the version, where and when,
// the settings that differ from the defaults), and per size the mean time
// and the fastest and slowest rank's (as OSU's -f). `wrong` is null when
// nothing was checked.
void writeJson(const Args& args, int ranks, const Formation& formation,
               const std::vector<Row>& rows, double avgBusbw) {
  using nlohmann::json;
  json config = json::object();
  const Config loaded = Config::load();
  for (const std::string& setting : loaded.nonDefault()) {
    const size_t eq = setting.find('=');
    config[setting.substr(0, eq)] = setting.substr(eq + 1);
  }
  json doc = {{"tool", "rdmacc-perf"},
              {"version", rdmacc::version()},
              {"argv", args.argv},
              {"host", hostName()},
              {"transport", loaded.getString("RDMACC_TRANSPORT")},
              {"rdma_ports", formation.rdmaPorts},
              {"started", args.started},
              {"finished", isoNow()},
              {"collective", args.collective},
              {"ranks", ranks},
              {"formation_ms", formation.milliseconds},
              {"formation_fastest_ms", formation.fastestMilliseconds},
              {"resident_mib", formation.residentMiB},
              {"threads", formation.threads},
              {"queue_pairs_after", formation.queuePairsAfter},
              {"pinned_mib_after", formation.pinnedMiBAfter},
              {"receives_after", formation.receivesAfter},
              {"resident_mib_after", formation.residentMiBAfter},
              {"dtype", toString(args.dtype)},
              {"op", toString(args.op)},
              {"root", args.root},
              {"algorithm", toString(args.algorithm)},
              {"registered", args.registerBuffers},
              {"iterations", args.iterations},
              {"warmup", args.warmup},
              {"buffers", args.buffers},
              {"second_group", args.secondGroup},
              {"second_group_alone", args.secondGroupAlone},
              {"config", config},
              {"checked", args.check},
              {"avg_busbw_gbs", avgBusbw},
              {"rows", json::array()}};
  for (const Row& r : rows) {
    doc["rows"].push_back({{"size", r.bytes},
                           {"count", r.count},
                           {"in_place", r.inPlace},
                           {"time_us", r.time},
                           {"time_min_us", r.minTime},
                           {"time_max_us", r.maxTime},
                           {"algbw_gbs", r.algbw},
                           {"busbw_gbs", r.busbw},
                           {"wrong", args.check ? json(r.wrong) : json(nullptr)}});
  }
  std::ofstream out(args.json);
  out << doc.dump(2) << "\n";
  if (!out) throw Error(ErrorKind::InvalidArgument, fmt::format("cannot write {}", args.json));
}

}  // namespace rdmacc::perf
