#include "common/tokenizer/token_table.h"

#include <algorithm>
#include <functional>

namespace llmctl::tokenizer_internal {
namespace {

constexpr size_t kFirstSlotCount = 16;
constexpr uint64_t kHashTagMask = 0xFFFFFFFF00000000;

uint64_t HashOf(std::string_view token) { return std::hash<std::string_view>{}(token); }

uint64_t SlotOf(uint64_t hash, uint32_t entry) {
  return (hash & kHashTagMask) | (uint64_t{entry} + 1);
}
uint32_t EntryIn(uint64_t slot) { return static_cast<uint32_t>(slot) - 1; }

}  // namespace

void TokenTable::Set(std::string_view token, int32_t id) {
  by_id_.clear();
  if (2 * (entries_.size() + 1) > slots_.size()) Grow();
  const uint64_t hash = HashOf(token);
  uint64_t& slot = slots_[FindSlot(token, hash)];
  if (slot != 0) {
    entries_[EntryIn(slot)].id = id;
    return;
  }
  const auto entry = static_cast<uint32_t>(entries_.size());
  entries_.push_back(
      {static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(token.size()), id});
  bytes_.append(token);
  slot = SlotOf(hash, entry);
}

void TokenTable::IndexIds() {
  bytes_.shrink_to_fit();
  entries_.shrink_to_fit();
  // (id << 32 | entry), sorted: a flat sort, where comparing through the entries would jump about
  // the table.
  std::vector<uint64_t> id_entries(entries_.size());
  for (uint32_t entry = 0; entry < entries_.size(); ++entry) {
    id_entries[entry] = uint64_t{static_cast<uint32_t>(entries_[entry].id)} << 32 | entry;
  }
  std::sort(id_entries.begin(), id_entries.end());
  by_id_.clear();
  by_id_.reserve(id_entries.size());
  for (size_t i = 0; i < id_entries.size(); ++i) {
    const auto entry = static_cast<uint32_t>(id_entries[i]);
    if (!by_id_.empty() && entries_[by_id_.back()].id == entries_[entry].id) {
      if (TokenAt(entry) < TokenAt(by_id_.back())) by_id_.back() = entry;
    } else {
      by_id_.push_back(entry);
    }
  }
  by_id_.shrink_to_fit();
  max_id_ = by_id_.empty() ? -1 : entries_[by_id_.back()].id;
}

std::optional<int32_t> TokenTable::IdOf(std::string_view token) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t slot = slots_[FindSlot(token, HashOf(token))];
  if (slot == 0) return std::nullopt;
  return entries_[EntryIn(slot)].id;
}

std::optional<std::string_view> TokenTable::TokenOf(int32_t id) const {
  if (id < 0) return std::nullopt;
  const auto position = static_cast<size_t>(id);
  if (position < by_id_.size() && entries_[by_id_[position]].id == id) {
    return TokenAt(by_id_[position]);
  }
  const auto it = std::lower_bound(
      by_id_.begin(), by_id_.end(), id,
      [this](uint32_t entry, int32_t wanted) { return entries_[entry].id < wanted; });
  if (it == by_id_.end() || entries_[*it].id != id) return std::nullopt;
  return TokenAt(*it);
}

size_t TokenTable::FindSlot(std::string_view token, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  for (size_t index = hash & mask;; index = (index + 1) & mask) {
    const uint64_t slot = slots_[index];
    if (slot == 0 || (((slot ^ hash) & kHashTagMask) == 0 && TokenAt(EntryIn(slot)) == token)) {
      return index;
    }
  }
}

void TokenTable::Grow() {
  slots_.assign(std::max(kFirstSlotCount, 2 * slots_.size()), 0);
  const size_t mask = slots_.size() - 1;
  for (uint32_t entry = 0; entry < entries_.size(); ++entry) {
    const uint64_t hash = HashOf(TokenAt(entry));
    size_t index = hash & mask;
    while (slots_[index] != 0) index = (index + 1) & mask;
    slots_[index] = SlotOf(hash, entry);
  }
}

}  // namespace llmctl::tokenizer_internal
