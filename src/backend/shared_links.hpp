// The process's shared connections (docs/decisions/019): which links its
// groups made, what a forming group tells its peers about them, and the
// decision every member of the group takes from the same records: attach
// to a link all members have (no mesh, no queue pair, no slot memory of its
// own) or make its own mesh and offer it to later groups.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/transport/link.hpp"

namespace rdmacc {

class Mesh;

// A link of this process's registry, held while a group decides.
struct OfferedLink {
  std::string id;
  std::shared_ptr<Link> link;
  std::shared_ptr<Mesh> mesh;  // the link's (its protection domain, counters)
  // The region this rank registered for the group's one-shot board over
  // the link (Link::registerBoard); none when the link has no board.
  std::optional<RemoteWrites::Region> board;
};

// What a forming group's rank tells the others: `line`, a carried line of
// its host record: the id this rank would give a link the group founds
// (rank 0's is taken), then "id:linkRank:channel:address:rkey" per link of
// the process whose connections suit `suits` (the settings they were made
// with: only a group with the same text may use them); "-" when sharing is
// off. The group's rank 0 (`founder`) draws the channel the group would
// take on each link (Link::allotChannel), the others write "-" there; the
// address and rkey are of a region each rank registers for the group's
// one-shot board of `members` ranks over that link ("-:-": the link has no
// board). `held` keeps those links and regions until the group has decided.
struct LinkOffers {
  std::string line;
  std::vector<OfferedLink> held;
};
LinkOffers offerLinks(bool share, const std::string& suits, bool founder, int members);
// A formation that failed on this rank before the group's decision: a
// peer that read every record may have chosen any of the links offered
// and write this rank's board region over it, so each region goes to its
// link (Link::retire) instead of being freed with the offers.
void retireBoards(LinkOffers& offers);

// What a forming group attaches to: `link`'s channel `channel` (rank 0's
// draw), group rank r being link rank toBase[r].
struct LinkChoice {
  std::shared_ptr<Link> link;
  std::shared_ptr<Mesh> mesh;
  uint32_t channel = 0;
  std::vector<int> toBase;
  std::optional<Link::ChannelBoard> board;  // when every member offered a region
};

// The decision, the same on every member: `lines` are every rank's offers
// line by rank (hostile input: a malformed one, or a channel rank 0's link
// rank does not number, throws Error naming the rank). The first link of
// rank 0's offers that every member offers; nullopt: the group makes its
// own connections.
std::optional<LinkChoice> chooseLink(const LinkOffers& mine, const std::vector<std::string>& lines,
                                     int rank);

// A forming group's hold on the channel it chose, from the decision until
// the channel opens here (opened()): if the formation fails on this rank
// first, the destructor closes the channel as if it had opened
// (Link::abandon), since peers that opened it may already write this
// rank's board region and wait for its messages.
class ChannelClaim {
 public:
  ChannelClaim(std::shared_ptr<Link> link, uint32_t channel, std::vector<int> toBase,
               uint32_t group, std::shared_ptr<void> board);
  ~ChannelClaim();
  ChannelClaim(const ChannelClaim&) = delete;
  ChannelClaim& operator=(const ChannelClaim&) = delete;
  void opened() { link_.reset(); }

 private:
  std::shared_ptr<Link> link_;
  uint32_t channel_;
  std::vector<int> toBase_;
  uint32_t group_;
  std::shared_ptr<void> board_;
};

// The id of a link the group founds: rank 0's drawn one; empty when
// sharing is off.
std::string foundingLinkId(const std::vector<std::string>& lines);

// Registers a link a group founded, for the process's later groups (held
// weakly: it goes with the last group that uses it).
void addLink(const std::string& id, const std::string& suits, const std::shared_ptr<Link>& link,
             const std::shared_ptr<Mesh>& mesh);

}  // namespace rdmacc
