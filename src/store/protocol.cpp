#include "src/store/protocol.hpp"

#include <fmt/format.h>

#include "rdmacc/error.hpp"

#include <algorithm>
#include <cstring>

namespace rdmacc::store_protocol {
namespace {

void putBlob(std::vector<uint8_t>& out, const void* data, size_t size) {
  putU32(out, static_cast<uint32_t>(size));
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + size);
}

// Reads fields of one body, failing (never throwing, never reading past the
// end) on any inconsistency.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool u8(uint8_t& v) {
    if (n_ < 1) return fail("truncated");
    v = *p_++;
    --n_;
    return true;
  }
  bool u32(uint32_t& v) {
    if (n_ < 4) return fail("truncated");
    v = getU32(p_);
    p_ += 4;
    n_ -= 4;
    return true;
  }
  bool i64(int64_t& v) {
    if (n_ < 8) return fail("truncated");
    v = getI64(p_);
    p_ += 8;
    n_ -= 8;
    return true;
  }
  bool blob(std::vector<uint8_t>& v, uint32_t limit, const char* what) {
    uint32_t len = 0;
    if (!u32(len)) return false;
    if (len > limit)
      return fail(fmt::format("{} of {} bytes exceeds the limit of {}", what, len, limit));
    if (len > n_) return fail(fmt::format("{} length {} exceeds the frame", what, len));
    v.assign(p_, p_ + len);
    p_ += len;
    n_ -= len;
    return true;
  }
  bool key(std::string& k) {
    std::vector<uint8_t> bytes;
    if (!blob(bytes, kMaxKeyBytes, "key")) return false;
    k.assign(bytes.begin(), bytes.end());
    return true;
  }
  bool done() { return n_ == 0 ? true : fail(fmt::format("{} trailing bytes", n_)); }
  bool fail(std::string reason) {
    if (reason_.empty()) reason_ = std::move(reason);
    return false;
  }
  const std::string& reason() const { return reason_; }

 private:
  const uint8_t* p_;
  size_t n_;
  std::string reason_;
};

// Splits off one frame; returns false with state set when there is none.
bool frame(const uint8_t* data, size_t size, DecodeResult& r, const uint8_t*& body, uint32_t& len) {
  if (size < 4) return false;
  len = getU32(data);
  if (len == 0 || len > kMaxFrameBytes) {
    r.state = Decode::Malformed;
    r.reason = fmt::format("frame length {} outside 1..{}", len, kMaxFrameBytes);
    return false;
  }
  if (size - 4 < len) return false;
  body = data + 4;
  r.consumed = 4 + static_cast<size_t>(len);
  return true;
}

std::vector<uint8_t> withLength(std::vector<uint8_t> body) {
  std::vector<uint8_t> out;
  out.reserve(body.size() + 4);
  putU32(out, static_cast<uint32_t>(body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

}  // namespace

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t getU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void putI64(std::vector<uint8_t>& out, int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

int64_t getI64(const uint8_t* p) {
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | p[i];
  return static_cast<int64_t>(u);
}

// What the wire cannot carry is refused before anything is sent: a length
// cast to 32 bits would desynchronise the stream (a 4 GiB value would announce
// 0 bytes and the server would read the value as the next requests).
void checkSendable(const Request& request) {
  auto refuse = [](std::string message) {
    throw Error(ErrorKind::InvalidArgument, std::move(message),
                "store values are for rendezvous data; move bulk data with collectives");
  };
  if (request.keys.size() > kMaxKeysPerRequest) {
    refuse(fmt::format("a store request with {} keys (the limit is {})", request.keys.size(),
                       kMaxKeysPerRequest));
  }
  for (const auto& k : request.keys) {
    if (k.size() > kMaxKeyBytes) {
      refuse(fmt::format("a store key of {} bytes (the limit is {})", k.size(), kMaxKeyBytes));
    }
  }
  if (request.value.size() > kMaxValueBytes) {
    refuse(fmt::format("a store value of {} bytes for key '{}' (the limit is {} bytes)",
                       request.value.size(), request.keys.empty() ? "" : request.keys.front(),
                       kMaxValueBytes));
  }
}

std::vector<uint8_t> encode(const Request& request) {
  checkSendable(request);
  std::vector<uint8_t> body;
  body.push_back(static_cast<uint8_t>(request.command));
  switch (request.command) {
    case Command::Check:
    case Command::Wait:
    case Command::MultiGet:
      putU32(body, static_cast<uint32_t>(request.keys.size()));
      for (const auto& k : request.keys) putBlob(body, k.data(), k.size());
      break;
    default:
      putBlob(body, request.keys.at(0).data(), request.keys.at(0).size());
      break;
  }
  if (request.command == Command::Set) putBlob(body, request.value.data(), request.value.size());
  if (request.command == Command::Add) putI64(body, request.delta);
  return withLength(std::move(body));
}

std::vector<uint8_t> encodeValues(const std::vector<std::vector<uint8_t>>& values) {
  std::vector<uint8_t> out;
  for (const auto& v : values) putBlob(out, v.data(), v.size());
  return out;
}

std::optional<std::vector<std::vector<uint8_t>>> decodeValues(const std::vector<uint8_t>& value,
                                                              size_t count) {
  std::vector<std::vector<uint8_t>> values;
  values.reserve(std::min(count, size_t{kMaxKeysPerRequest}));
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    if (value.size() - at < 4) return std::nullopt;
    const uint32_t n = getU32(value.data() + at);
    at += 4;
    if (value.size() - at < n) return std::nullopt;
    values.emplace_back(value.begin() + static_cast<std::ptrdiff_t>(at),
                        value.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  if (at != value.size()) return std::nullopt;
  return values;
}

std::vector<uint8_t> encode(const AuthFrame& frame) {
  std::vector<uint8_t> body;
  body.push_back(static_cast<uint8_t>(frame.tag));
  body.insert(body.end(), frame.body.begin(), frame.body.end());
  return withLength(std::move(body));
}

DecodeResult decode(const uint8_t* data, size_t size, AuthFrame& out) {
  // The length is checked before the body arrives: a client that has not
  // authenticated cannot make the server hold more than this.
  DecodeResult r;
  if (size < 4) return r;
  const uint32_t len = getU32(data);
  if (len == 0 || len > kMaxAuthBodyBytes + 1) {
    r.state = Decode::Malformed;
    r.reason = fmt::format("a frame of {} bytes where authentication was due", len);
    return r;
  }
  if (size - 4 < len) return r;
  const uint8_t* body = data + 4;
  const uint8_t tag = body[0];
  if (tag < static_cast<uint8_t>(AuthTag::Hello) || tag > static_cast<uint8_t>(AuthTag::Proof)) {
    r.state = Decode::Malformed;
    r.reason = fmt::format("a request where authentication was due (first byte {:#04x})", tag);
    return r;
  }
  out.tag = static_cast<AuthTag>(tag);
  out.body.assign(body + 1, body + len);
  r.state = Decode::Ok;
  r.consumed = 4 + static_cast<size_t>(len);
  return r;
}

std::vector<uint8_t> encode(const Response& response) {
  std::vector<uint8_t> body;
  body.push_back(static_cast<uint8_t>(response.status));
  if (response.status == Status::Error) {
    putBlob(body, response.error.data(), response.error.size());
  } else {
    putBlob(body, response.value.data(), response.value.size());
  }
  return withLength(std::move(body));
}

DecodeResult decode(const uint8_t* data, size_t size, Request& out) {
  DecodeResult r;
  const uint8_t* body = nullptr;
  uint32_t len = 0;
  if (!frame(data, size, r, body, len)) return r;
  Reader in(body, len);
  Request req;
  uint8_t cmd = 0;
  bool ok = in.u8(cmd);
  if (ok) {
    req.command = static_cast<Command>(cmd);
    switch (req.command) {
      case Command::Set:
      case Command::Get:
      case Command::Add:
      case Command::Delete: {
        req.keys.emplace_back();
        ok = in.key(req.keys.back());
        if (ok && req.command == Command::Set) ok = in.blob(req.value, kMaxValueBytes, "value");
        if (ok && req.command == Command::Add) ok = in.i64(req.delta);
        break;
      }
      case Command::Check:
      case Command::Wait:
      case Command::MultiGet: {
        uint32_t n = 0;
        ok = in.u32(n);
        if (ok && n > kMaxKeysPerRequest) {
          ok = in.fail(fmt::format("{} keys exceed the limit of {}", n, kMaxKeysPerRequest));
        }
        for (uint32_t i = 0; ok && i < n; ++i) {
          req.keys.emplace_back();
          ok = in.key(req.keys.back());
        }
        break;
      }
      default:
        ok = in.fail(fmt::format("unknown command {}", cmd));
    }
  }
  if (ok) ok = in.done();
  if (!ok) {
    r.state = Decode::Malformed;
    r.reason = in.reason();
    return r;
  }
  out = std::move(req);
  r.state = Decode::Ok;
  return r;
}

DecodeResult decode(const uint8_t* data, size_t size, Response& out) {
  DecodeResult r;
  const uint8_t* body = nullptr;
  uint32_t len = 0;
  if (!frame(data, size, r, body, len)) return r;
  Reader in(body, len);
  Response resp;
  uint8_t status = 0;
  bool ok = in.u8(status);
  if (ok && status > static_cast<uint8_t>(Status::Error)) ok = in.fail("unknown status");
  if (ok) {
    resp.status = static_cast<Status>(status);
    ok = in.blob(resp.value, kMaxValueBytes, "value");
    if (ok && resp.status == Status::Error) {
      resp.error.assign(resp.value.begin(), resp.value.end());
      resp.value.clear();
    }
  }
  if (ok) ok = in.done();
  if (!ok) {
    r.state = Decode::Malformed;
    r.reason = in.reason();
    return r;
  }
  out = std::move(resp);
  r.state = Decode::Ok;
  return r;
}

}  // namespace rdmacc::store_protocol
