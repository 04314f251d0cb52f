// The store's schema as an ordered list of migrations. Migration i (0-based) takes a database from
// PRAGMA user_version i to i + 1. Append new migrations; never edit one that has shipped. A view
// that a later migration recreates (DROP VIEW, CREATE VIEW) has one definition, which the migration
// that first created it reads too: a fresh database passes through the newer view on its way, and
// every database ends with the same one (such a definition may read only what that first
// migration's database has).
#ifndef LLMCTL_CONTROLLER_STORE_SCHEMA_H_
#define LLMCTL_CONTROLLER_STORE_SCHEMA_H_

#include <span>
#include <string_view>

namespace llmctl::store {

std::span<const std::string_view> Migrations();

}  // namespace llmctl::store

#endif  // LLMCTL_CONTROLLER_STORE_SCHEMA_H_
