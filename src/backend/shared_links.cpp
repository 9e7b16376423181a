#include "src/backend/shared_links.hpp"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "rdmacc/error.hpp"
#include "src/store/auth.hpp"
#include "src/store/store_util.hpp"

namespace rdmacc {
namespace {

// Offers per record: a carried line holds 512 bytes (host_identity.hpp),
// and an offer takes at most 77 of them.
constexpr size_t kMaxOffers = 6;
constexpr size_t kIdChars = 32;  // 128 random bits

struct Registered {
  std::string id;
  std::string suits;
  std::weak_ptr<Link> link;
  std::weak_ptr<Mesh> mesh;
};

std::mutex registryMutex;
std::vector<Registered> registry;  // oldest first

struct Offer {
  std::string id;
  int linkRank = -1;
  uint32_t channel = 0;  // rank 0's: the channel it drew for the group
  std::optional<std::pair<uint64_t, uint32_t>> board;  // its board region: address, rkey
};
struct Parsed {
  std::string candidate;  // "-": sharing off
  std::vector<Offer> offers;
};

bool validId(std::string_view id) {
  return id.size() == kIdChars && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

template <typename T>
bool number(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

// A board region's address and rkey in hexadecimal, or "-" for both.
bool boardField(std::string_view addr, std::string_view rkey,
                std::optional<std::pair<uint64_t, uint32_t>>& out) {
  if (addr == "-" && rkey == "-") return true;
  std::pair<uint64_t, uint32_t> region;
  auto hex = [](std::string_view text, auto& value) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
    return ec == std::errc() && end == text.data() + text.size() && !text.empty();
  };
  if (addr.size() > 16 || rkey.size() > 8 || !hex(addr, region.first) ||
      !hex(rkey, region.second) || region.first == 0) {
    return false;
  }
  out = region;
  return true;
}

Parsed parse(const std::string& line, int rank) {
  auto malformed = [&](const std::string& what) {
    return Error(ErrorInfo{
        .kind = ErrorKind::Protocol,
        .message = fmt::format("rank {} published shared-connection offers that are not "
                               "rdmacc's ({}): '{}'",
                               rank, what, line.substr(0, 64)),
        .peerRank = rank,
        .hint = "every rank must run the same rdmacc; the store may hold another job's records"});
  };
  const auto fields = splitFields(line, ' ');
  if (fields.empty()) throw malformed("empty");
  Parsed p;
  p.candidate = fields[0];
  if (p.candidate == "-") {
    if (fields.size() != 1) throw malformed("offers while sharing is off");
    return p;
  }
  if (!validId(p.candidate)) throw malformed("a link id of 32 hexadecimal digits first");
  if (fields.size() - 1 > kMaxOffers) throw malformed("too many offers");
  for (size_t i = 1; i < fields.size(); ++i) {
    const auto parts = splitFields(fields[i], ':');
    Offer o;
    // Rank 0 draws the group's channel; the others name none.
    const bool channel =
        parts.size() == 5 && (rank == 0 ? number(parts[2], o.channel) : parts[2] == "-");
    if (parts.size() != 5 || !validId(parts[0]) || !number(parts[1], o.linkRank) ||
        o.linkRank < 0 || !channel || !boardField(parts[3], parts[4], o.board)) {
      throw malformed(fmt::format("offer {}", i));
    }
    o.id = parts[0];
    if (std::any_of(p.offers.begin(), p.offers.end(),
                    [&](const Offer& other) { return other.id == o.id; })) {
      throw malformed("a link offered twice");
    }
    p.offers.push_back(std::move(o));
  }
  return p;
}

}  // namespace

LinkOffers offerLinks(bool share, const std::string& suits, bool founder, int members) {
  LinkOffers offers;
  if (!share) {
    offers.line = "-";
    return offers;
  }
  offers.line = auth::randomHex().substr(0, kIdChars);
  std::lock_guard lock(registryMutex);
  std::erase_if(registry, [](const Registered& r) { return r.link.expired(); });
  // The most recent first: a DeviceMesh's groups attach to the world's.
  for (auto it = registry.rbegin(); it != registry.rend() && offers.held.size() < kMaxOffers;
       ++it) {
    if (it->suits != suits) continue;
    auto link = it->link.lock();
    if (!link) continue;
    std::string channel = "-";
    if (founder) {
      const auto drawn = link->allotChannel();
      if (!drawn) continue;  // all of its numbers used: the group makes its own
      channel = std::to_string(*drawn);
    }
    auto mesh = it->mesh.lock();  // the link holds it
    auto board = link->registerBoard(members);
    offers.line += fmt::format(" {}:{}:{}:{}", it->id, link->rank(), channel,
                               board ? fmt::format("{:x}:{:x}", board->addr, board->rkey) : "-:-");
    offers.held.push_back({it->id, std::move(link), std::move(mesh), std::move(board)});
  }
  return offers;
}

void retireBoards(LinkOffers& offers) {
  for (OfferedLink& held : offers.held) {
    if (held.board) held.link->retire(std::move(held.board->keep));
  }
}

std::optional<LinkChoice> chooseLink(const LinkOffers& mine, const std::vector<std::string>& lines,
                                     int rank) {
  std::vector<Parsed> parsed;
  for (size_t r = 0; r < lines.size(); ++r) parsed.push_back(parse(lines[r], static_cast<int>(r)));
  if (std::any_of(parsed.begin(), parsed.end(),
                  [](const Parsed& p) { return p.candidate == "-"; })) {
    return std::nullopt;
  }
  for (const Offer& first : parsed[0].offers) {
    LinkChoice choice;
    std::vector<const Offer*> offersOf;  // by group rank: its offer of this link
    bool everyone = true;
    for (const Parsed& p : parsed) {
      auto o = std::find_if(p.offers.begin(), p.offers.end(),
                            [&](const Offer& each) { return each.id == first.id; });
      if (o == p.offers.end()) {
        everyone = false;
        break;
      }
      choice.toBase.push_back(o->linkRank);
      offersOf.push_back(&*o);
    }
    choice.channel = first.channel;
    if (!everyone) continue;
    auto held = std::find_if(mine.held.begin(), mine.held.end(),
                             [&](const OfferedLink& l) { return l.id == first.id; });
    if (held == mine.held.end()) {
      throw Error(
          ErrorKind::Internal,
          fmt::format("the group chose shared connections {} this rank did not offer", first.id));
    }
    // Every member checks the same ranks against the same link's size.
    std::vector<bool> seen(static_cast<size_t>(held->link->size()), false);
    for (size_t r = 0; r < choice.toBase.size(); ++r) {
      const int b = choice.toBase[r];
      if (b >= held->link->size() || seen[static_cast<size_t>(b)]) {
        throw Error(ErrorInfo{
            .kind = ErrorKind::Protocol,
            .message = fmt::format("rank {} offered rank {} of shared connections of {} ranks, "
                                   "taken or out of range",
                                   r, b, held->link->size()),
            .peerRank = static_cast<int>(r)});
      }
      seen[static_cast<size_t>(b)] = true;
    }
    if (!Link::foundedBy(choice.channel, choice.toBase[0], held->link->size())) {
      throw Error(ErrorInfo{
          .kind = ErrorKind::Protocol,
          .message = fmt::format("rank 0 offered channel {} of shared connections of {} ranks, "
                                 "which its link rank {} does not number",
                                 choice.channel, held->link->size(), choice.toBase[0]),
          .peerRank = 0,
          .hint = "every rank must run the same rdmacc"});
    }
    if (choice.toBase[static_cast<size_t>(rank)] != held->link->rank()) {
      throw Error(ErrorKind::Internal, "this rank's own offer names another link rank");
    }
    choice.link = held->link;
    choice.mesh = held->mesh;
    // A board when every member registered a region (all or none do: the
    // link's connections have one or not, the same on every member).
    if (held->board && std::all_of(offersOf.begin(), offersOf.end(),
                                   [](const Offer* o) { return o->board.has_value(); })) {
      Link::ChannelBoard board{.mine = *held->board};
      for (const Offer* o : offersOf) board.regions.push_back(*o->board);
      choice.board = std::move(board);
    }
    return choice;
  }
  return std::nullopt;
}

ChannelClaim::ChannelClaim(std::shared_ptr<Link> link, uint32_t channel, std::vector<int> toBase,
                           uint32_t group, std::shared_ptr<void> board)
    : link_(std::move(link)),
      channel_(channel),
      toBase_(std::move(toBase)),
      group_(group),
      board_(std::move(board)) {}

ChannelClaim::~ChannelClaim() {
  if (link_) link_->abandon(channel_, toBase_, group_, std::move(board_));
}

std::string foundingLinkId(const std::vector<std::string>& lines) {
  if (lines.empty()) return {};
  const auto fields = splitFields(lines[0], ' ');
  return fields.empty() || fields[0] == "-" ? std::string() : std::string(fields[0]);
}

void addLink(const std::string& id, const std::string& suits, const std::shared_ptr<Link>& link,
             const std::shared_ptr<Mesh>& mesh) {
  std::lock_guard lock(registryMutex);
  std::erase_if(registry, [](const Registered& r) { return r.link.expired(); });
  // An id drawn twice (or a rank 0 that repeats one) would make offers
  // ambiguous: that link stays its group's own.
  if (std::any_of(registry.begin(), registry.end(),
                  [&](const Registered& r) { return r.id == id; })) {
    return;
  }
  registry.push_back({id, suits, link, mesh});
}

}  // namespace rdmacc
