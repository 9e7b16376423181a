// Wire format of the TCP store. Every frame is a little-endian u32 body length
// followed by the body; every length inside is validated against the limits
// below before anything is allocated, so a malformed or hostile frame costs the
// server one closed connection and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmacc::store_protocol {

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 256u << 20;  // 256 MiB
constexpr uint32_t kMaxKeysPerRequest = 65536;
constexpr uint32_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;

// MultiGet: every key's value once all exist (a Get of many keys), the
// reply's value holding each as a u32 length and its bytes, in order.
enum class Command : uint8_t {
  Set = 1,
  Get = 2,
  Add = 3,
  Check = 4,
  Wait = 5,
  Delete = 6,
  MultiGet = 7,
};
constexpr uint8_t kCommands = 7;
enum class Status : uint8_t { Ok = 0, Error = 1 };

struct Request {
  Command command = Command::Get;
  std::vector<std::string> keys;  // one for Set/Get/Add/Delete, any for Check/Wait/MultiGet
  std::vector<uint8_t> value;     // Set
  int64_t delta = 0;              // Add
};

struct Response {
  Status status = Status::Ok;
  std::vector<uint8_t> value;  // Get: the value; Add: i64; Check/Delete: one byte 0/1
  std::string error;           // Status::Error
};

enum class Decode { NeedMore, Ok, Malformed };

struct DecodeResult {
  Decode state = Decode::NeedMore;
  size_t consumed = 0;  // bytes of the frame when Ok
  std::string reason;   // when Malformed
};

// Authentication (RDMACC_AUTH_KEY), before any request, all in ordinary
// frames: the client sends Hello (its nonce), the server a Challenge (its
// nonce and its proof: HMAC over both nonces), the client a Proof (HMAC over
// both in the other order). A server without a key takes Hello for a
// malformed request and closes; a client without a key sends a request,
// which a server with one answers with an error reply and closes.
enum class AuthTag : uint8_t { Hello = 0xA0, Challenge = 0xA1, Proof = 0xA2 };
constexpr size_t kMaxAuthBodyBytes = 128;
struct AuthFrame {
  AuthTag tag = AuthTag::Hello;
  std::vector<uint8_t> body;  // the bytes after the tag
};
std::vector<uint8_t> encode(const AuthFrame& frame);
// Malformed for an unknown tag or a body over kMaxAuthBodyBytes (the sizes
// each tag needs are the caller's to check).
DecodeResult decode(const uint8_t* data, size_t size, AuthFrame& out);

// A MultiGet reply's value: the values in order, or nullopt when it is not
// `count` well-formed length-prefixed blobs.
std::vector<uint8_t> encodeValues(const std::vector<std::vector<uint8_t>>& values);
std::optional<std::vector<std::vector<uint8_t>>> decodeValues(const std::vector<uint8_t>& value,
                                                              size_t count);

std::vector<uint8_t> encode(const Request& request);
std::vector<uint8_t> encode(const Response& response);
DecodeResult decode(const uint8_t* data, size_t size, Request& out);
DecodeResult decode(const uint8_t* data, size_t size, Response& out);

void putU32(std::vector<uint8_t>& out, uint32_t v);
uint32_t getU32(const uint8_t* p);
void putI64(std::vector<uint8_t>& out, int64_t v);
int64_t getI64(const uint8_t* p);

}  // namespace rdmacc::store_protocol
