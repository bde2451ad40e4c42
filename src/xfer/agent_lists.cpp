// Agent: descriptor lists, validated against registered regions when prepared.
#include <fmt/format.h>

#include "agent_impl.h"

namespace eplb::xfer {
namespace {

std::string describe_descriptor(const char* side, size_t index, const Descriptor& descriptor) {
  return fmt::format("{} descriptor {} (address {:#x}, {} bytes, device {})", side, index, descriptor.address,
                     descriptor.length, descriptor.device_id);
}

bool contains(uint64_t region_address, uint64_t region_length, const Descriptor& descriptor) {
  return descriptor.address >= region_address && descriptor.address - region_address <= region_length &&
         descriptor.length <= region_length - (descriptor.address - region_address);
}

Status check_shape(const std::string& agent, const char* side, size_t index, const Descriptor& descriptor) {
  if (descriptor.length == 0)
    return error(Code::InvalidArgument, "agent " + agent + ": " + describe_descriptor(side, index, descriptor) +
                                            " is empty");
  if (descriptor.address + descriptor.length < descriptor.address)
    return error(Code::InvalidArgument, "agent " + agent + ": " + describe_descriptor(side, index, descriptor) +
                                            " wraps around the address space");
  return Status::ok();
}

// Appends, merging into the previous entry when contiguous in the same region.
void append(std::vector<ListEntry>& entries, const ListEntry& entry, bool merge) {
  if (merge && !entries.empty()) {
    ListEntry& last = entries.back();
    if (last.address + last.length == entry.address && last.local_memory == entry.local_memory &&
        last.remote_key == entry.remote_key) {
      last.length += entry.length;
      return;
    }
  }
  entries.push_back(entry);
}

}  // namespace

Result<DescriptorListId> Agent::Impl::prepare_local(std::span<const Descriptor> descriptors, bool merge) {
  if (descriptors.empty()) return error(Code::InvalidArgument, "agent " + name_ + ": empty local descriptor list");
  auto list = std::make_shared<DescriptorListState>();
  list->entries.reserve(descriptors.size());
  for (size_t i = 0; i < descriptors.size(); ++i) {
    const Descriptor& descriptor = descriptors[i];
    EPLB_TRY(check_shape(name_, "local", i, descriptor));
    const std::shared_ptr<LocalRegionState>* match = nullptr;
    const LocalRegionState* other_device = nullptr;
    for (const auto& [id, state] : regions_) {
      if (!contains(reinterpret_cast<uintptr_t>(state->region.address), state->region.length, descriptor)) continue;
      if (state->region.device_id != descriptor.device_id) {
        other_device = state.get();
        continue;
      }
      match = &state;
      break;
    }
    if (match == nullptr) {
      std::string hint = other_device ? fmt::format(" (region {} covers it but has device {})", other_device->id,
                                                    other_device->region.device_id)
                                      : "";
      return error(Code::NotFound, "agent " + name_ + ": " + describe_descriptor("local", i, descriptor) +
                                       " is not inside one region registered on this agent" + hint);
    }
    if (list->regions.empty() || list->regions.back() != *match) list->regions.push_back(*match);
    append(list->entries, ListEntry{descriptor.address, descriptor.length, (*match)->memory.get(), nullptr}, merge);
  }
  DescriptorListId id = next_handle();
  lists_[id] = std::move(list);
  return id;
}

Result<DescriptorListId> Agent::Impl::prepare_remote(const std::string& peer_name, std::span<const Descriptor> descriptors,
                                                   bool merge) {
  auto found = peers_.find(peer_name);
  if (found == peers_.end())
    return error(Code::NotFound, "agent " + name_ + ": unknown peer " + peer_name + " (load its metadata first)");
  if (descriptors.empty())
    return error(Code::InvalidArgument, "agent " + name_ + ": empty remote descriptor list for agent " + peer_name);
  const PeerState& peer = *found->second;
  auto list = std::make_shared<DescriptorListState>();
  list->remote = true;
  list->peer = found->second;
  list->peer_generation = peer.generation;
  list->withdrawals_checked = peer.withdrawals;
  list->entries.reserve(descriptors.size());
  for (size_t i = 0; i < descriptors.size(); ++i) {
    const Descriptor& descriptor = descriptors[i];
    EPLB_TRY(check_shape(name_, "remote", i, descriptor));
    const RemoteRegionState* match = nullptr;
    const RemoteRegionState* other_device = nullptr;
    // Newest registration first: a peer that freed memory and registered
    // new memory at the same addresses (metadata loaded again) is read
    // through the new key; an older key may map memory it no longer uses.
    for (auto newest = peer.regions.rbegin(); newest != peer.regions.rend(); ++newest) {
      const RemoteRegionState& region = *newest->second;
      if (!contains(region.metadata.address, region.metadata.length, descriptor)) continue;
      if (region.metadata.device_id != descriptor.device_id) {
        other_device = &region;
        continue;
      }
      match = &region;
      if (list->remote_regions.empty() || list->remote_regions.back() != newest->second)
        list->remote_regions.push_back(newest->second);
      break;
    }
    if (match == nullptr) {
      std::string hint = other_device ? fmt::format(" (its region {} covers it but has device {})",
                                                    other_device->metadata.id, other_device->metadata.device_id)
                                      : "";
      return error(Code::NotFound, "agent " + name_ + ": " + describe_descriptor("remote", i, descriptor) +
                                       " is not inside one region agent " + peer_name + " registered" + hint);
    }
    append(list->entries, ListEntry{descriptor.address, descriptor.length, nullptr, match->key.get()}, merge);
  }
  DescriptorListId id = next_handle();
  lists_[id] = std::move(list);
  return id;
}

Result<size_t> Agent::Impl::descriptor_count(DescriptorListId id) const {
  auto found = lists_.find(id);
  if (found == lists_.end()) return error(Code::NotFound, fmt::format("agent {}: no descriptor list {}", name_, id));
  return found->second->entries.size();
}

Status Agent::Impl::release_descriptor_list(DescriptorListId id) {
  if (lists_.erase(id) == 0) return error(Code::NotFound, fmt::format("agent {}: no descriptor list {}", name_, id));
  return Status::ok();
}

bool Agent::Impl::uses_withdrawn_region(const DescriptorListState& list) const {
  for (const auto& region : list.remote_regions)
    if (region->withdrawn) return true;
  list.withdrawals_checked = list.peer->withdrawals;  // none of its regions: fast again
  return false;
}

Status Agent::Impl::stale_list_error(const DescriptorListState& list, const std::string& what) const {
  if (!list.peer->invalidated) {
    for (const auto& region : list.remote_regions)
      if (region->withdrawn)
        return error(Code::NotAllowed,
                     fmt::format("agent {}: {} points into region {} of agent {}, which the agent's full metadata no "
                                 "longer lists (deregistered there); prepare the list again",
                                 name_, what, region->metadata.id, list.peer->name));
  }
  return error(Code::NotAllowed, "agent " + name_ + ": " + what + " was prepared against agent " + list.peer->name +
                                     " before it was invalidated; load its metadata and prepare the list again");
}

}  // namespace eplb::xfer
