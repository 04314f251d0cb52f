// Chameleon's sites: each has its own Keystone, so a lease at KVM@TACC authenticates at KVM@TACC.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_SITES_H_
#define LLMCTL_CONTROLLER_OPENSTACK_SITES_H_

#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::openstack {

enum class SiteKind { kBareMetal, kKvm, kEdge };

struct Site {
  std::string_view name;            // also the Keystone region name, e.g. "KVM@TACC"
  std::string_view auth_url;        // "{web}:5000/v3"
  std::string_view oidc_client_id;  // Chameleon's openrc OS_CLIENT_ID for this site
  SiteKind kind;
};

// The built-in table (python-chi's context.py and Chameleon's openrc files).
std::span<const Site> ChameleonSites();

// By name, ASCII case ignored. NotFound with the known names (and the nearest one) otherwise.
StatusOr<Site> FindSite(std::string_view name);

// The site a flavor lives at when its name says so (g1.* GPU/KVM flavors → KVM@TACC); empty
// otherwise.
std::string_view SiteForFlavor(std::string_view flavor_name);

// The table's site whose Keystone is `auth_url` (trailing slashes ignored); empty when none.
std::string_view SiteForAuthUrl(std::string_view auth_url);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_SITES_H_
