#include "src/transport/shm/doorbell.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/store/socket.hpp"

namespace rdmacc::shm {
namespace {

// Not the abstract namespace, where any local user may bind a rank's name
// first or flood it: a directory only this user can enter.
std::string doorbellDirectory() {
  return fmt::format("/tmp/rdmacc-{}", ::geteuid());
}

}  // namespace

void prepareDoorbellDirectory() {
  const std::string dir = doorbellDirectory();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw errnoError(ErrorKind::Internal, "mkdir", errno,
                     fmt::format("creating {} for the wake-up sockets", dir), "");
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    throw errnoError(ErrorKind::Internal, "lstat", errno, fmt::format("checking {}", dir), "");
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} is not a private directory of this user (a {} of uid {} with mode "
                            "{:o}); rdmacc keeps its wake-up sockets there",
                            dir, S_ISDIR(st.st_mode) ? "directory" : "non-directory", st.st_uid,
                            st.st_mode & 07777),
                fmt::format("remove {} (another user may have created it to intercept this "
                            "user's processes)",
                            dir));
  }
  // A socket nobody holds any more refuses a connect (whatever pid
  // namespace its process lived in): that file is left from a crash.
  net::Fd probe(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  DIR* d = probe ? ::opendir(dir.c_str()) : nullptr;
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view file = e->d_name;
    if (!file.starts_with("rdmacc-") || !file.ends_with(".bell")) continue;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir + "/" + std::string(file);
    if (path.size() >= sizeof addr.sun_path) continue;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
        errno == ECONNREFUSED) {
      ::unlink(path.c_str());
    }
  }
  ::closedir(d);
}

sockaddr_un doorbellAddress(const std::string& name, socklen_t& length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = doorbellDirectory() + name + ".bell";
  if (path.size() >= sizeof addr.sun_path) {
    throw Error(ErrorKind::Internal, fmt::format("the wake-up socket path {} is too long", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return addr;
}

}  // namespace rdmacc::shm
