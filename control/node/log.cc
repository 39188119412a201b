#include "control/node/log.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace uroce::control {

namespace {
int g_level = 1;
LogFormat g_format = LogFormat::kText;
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};

bool needs_quotes(std::string_view v) {
  return v.empty() || std::any_of(v.begin(), v.end(), [](char c) {
           return c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
         });
}

/// logfmt's pairs, in order: key=value, key="quoted \"value\"".
nlohmann::ordered_json parse_kv(std::string_view kv) {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  std::size_t i = 0;
  while (i < kv.size()) {
    while (i < kv.size() && kv[i] == ' ') ++i;
    const std::size_t eq = kv.find('=', i);
    if (i >= kv.size()) break;
    if (eq == std::string_view::npos) {  // a bare word: a key with no value
      const std::size_t end = std::min(kv.find(' ', i), kv.size());
      o[std::string(kv.substr(i, end - i))] = true;
      i = end;
      continue;
    }
    const std::string key(kv.substr(i, eq - i));
    i = eq + 1;
    std::string value;
    if (i < kv.size() && kv[i] == '"') {
      for (++i; i < kv.size() && kv[i] != '"'; ++i) {
        if (kv[i] == '\\' && i + 1 < kv.size()) {
          ++i;
          value += kv[i] == 'n' ? '\n' : kv[i];
        } else {
          value += kv[i];
        }
      }
      ++i;  // the closing quote
    } else {
      const std::size_t end = std::min(kv.find(' ', i), kv.size());
      value = kv.substr(i, end - i);
      i = end;
    }
    o[key] = value;
  }
  return o;
}
}  // namespace

void set_log(int level, LogFormat format) {
  g_level = level;
  g_format = format;
}

std::string log_value(std::string_view v) {
  if (!needs_quotes(v)) return std::string(v);
  std::string o = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string format_log(LogFormat f, std::string_view ts, int level, std::string_view msg, std::string_view kv) {
  const char* name = kNames[std::clamp(level, 0, 3)];
  if (f == LogFormat::kJson) {
    nlohmann::ordered_json o = {{"ts", std::string(ts)}, {"level", name}, {"msg", std::string(msg)}};
    const nlohmann::ordered_json fields = parse_kv(kv);  // kept: items() refers to it
    for (const auto& [k, v] : fields.items())
      if (!o.contains(k)) o[k] = v;
    return o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = "ts=" + std::string(ts) + " level=" + name + " msg=";
  // msg is always quoted, as before (tools and tests read msg="...").
  std::string m = log_value(msg);
  if (m.front() != '"') m = "\"" + m + "\"";
  line += m;
  if (!kv.empty()) {
    line += ' ';
    line += kv;
  }
  return line;
}

void log(int level, const std::string& msg, const std::string& kv) {
  if (level < g_level) return;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char tbuf[40];
  tm t;
  gmtime_r(&ts.tv_sec, &t);
  const std::size_t n = strftime(tbuf, sizeof tbuf, "%Y-%m-%dT%H:%M:%S", &t);
  std::snprintf(tbuf + n, sizeof tbuf - n, ".%06ldZ", ts.tv_nsec / 1000);
  const std::string line = format_log(g_format, tbuf, level, msg, kv) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

bool LogLimit::allow(std::uint64_t now, std::uint64_t* suppressed) {
  *suppressed = 0;
  if (bucket_.take(now) != 0) {
    ++held_;
    return false;
  }
  *suppressed = held_;
  held_ = 0;
  return true;
}

}  // namespace uroce::control
