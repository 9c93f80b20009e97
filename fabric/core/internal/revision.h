// Internal: the project revision symbol behind BuildInfo::revision.
#ifndef FABRIC_CORE_INTERNAL_REVISION_H_
#define FABRIC_CORE_INTERNAL_REVISION_H_

namespace fabric::internal {

// Defined weakly in build_info.cc ("unstamped") and strongly by //fabric/core:stamp.
const char* project_revision();

}  // namespace fabric::internal

#endif  // FABRIC_CORE_INTERNAL_REVISION_H_
