#include "controller/openstack/sites.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "common/spelling.h"
#include "common/text.h"

namespace llmctl::openstack {
namespace {

// auth_url = "{web}:5000/v3" with web from https://api.chameleoncloud.org/sites.json; KVM@TACC is
// missing there and python-chi adds it. The OIDC client ids are those of each site's openrc.
// CHI@NCAR's and CHI@Edge's client ids were not seen in an openrc here: they follow the
// "keystone-<site>-prod" pattern and are the first thing to check if OIDC login fails there.
constexpr Site kSites[] = {
    {"CHI@UC", "https://chi.uc.chameleoncloud.org:5000/v3", "keystone-uc-prod",
     SiteKind::kBareMetal},
    {"CHI@TACC", "https://chi.tacc.chameleoncloud.org:5000/v3", "keystone-tacc-prod",
     SiteKind::kBareMetal},
    {"KVM@TACC", "https://kvm.tacc.chameleoncloud.org:5000/v3", "keystone-kvm-prod",
     SiteKind::kKvm},
    {"CHI@NCAR", "https://chi.hpc.ucar.edu:5000/v3", "keystone-ncar-prod", SiteKind::kBareMetal},
    {"CHI@Edge", "https://chi.edge.chameleoncloud.org:5000/v3", "keystone-edge-prod",
     SiteKind::kEdge},
};

}  // namespace

std::span<const Site> ChameleonSites() { return kSites; }

StatusOr<Site> FindSite(std::string_view name) {
  std::vector<std::string_view> names;
  for (const Site& site : kSites) {
    if (EqualsIgnoreCase(site.name, name)) return site;
    names.push_back(site.name);
  }
  std::string message = "unknown site '" + std::string(name) + "'";
  std::string_view close = ClosestMatch(name, names);
  if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
  std::string list;
  for (auto known : names) list += (list.empty() ? "" : ", ") + std::string(known);
  return NotFoundError(message + "; known sites: " + list);
}

std::string_view SiteForFlavor(std::string_view flavor_name) {
  return flavor_name.starts_with("g1.") ? "KVM@TACC" : "";
}

std::string_view SiteForAuthUrl(std::string_view auth_url) {
  while (auth_url.ends_with('/')) auth_url.remove_suffix(1);
  for (const Site& site : kSites) {
    if (site.auth_url == auth_url) return site.name;
  }
  return "";
}

}  // namespace llmctl::openstack
