// The rendezvous store listens on loopback by default: reachable at 127.0.0.1, refused on this
// host's other addresses; listen_address "" (jobs spanning nodes) accepts them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <optional>
#include <string>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

namespace {

using fabric::distributed::make_store;
using fabric::distributed::store_port;
using fabric::distributed::StoreOptions;

std::optional<std::string> non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    if (std::string(buf).rfind("127.", 0) != 0) found = buf;
  }
  freeifaddrs(list);
  return found;
}

bool can_connect(const std::string& ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

StoreOptions server(const std::string& listen_address) {
  StoreOptions o;
  o.is_server = true;
  o.world_size = 2;
  o.timeout = std::chrono::milliseconds(5000);
  o.listen_address = listen_address;
  return o;
}

TEST(StoreTest, DefaultListensOnLoopbackOnly) {
  auto store = make_store(server("127.0.0.1"));
  const int port = store_port(store);
  ASSERT_GT(port, 0);
  EXPECT_TRUE(can_connect("127.0.0.1", port));
  // A client reaches it and the store works (the server took over the listening socket).
  StoreOptions client;
  client.port = port;
  client.world_size = 2;
  client.timeout = std::chrono::milliseconds(5000);
  auto other = make_store(client);
  other->set("key", std::vector<uint8_t>{1, 2, 3});
  EXPECT_EQ(store->get("key"), (std::vector<uint8_t>{1, 2, 3}));

  const auto ip = non_loopback_ipv4();
  if (!ip) GTEST_SKIP() << "this host has no non-loopback IPv4 address to try";
  EXPECT_FALSE(can_connect(*ip, port)) << "reachable from " << *ip;
}

TEST(StoreTest, EmptyListenAddressAcceptsEveryInterface) {
  const auto ip = non_loopback_ipv4();
  if (!ip) GTEST_SKIP() << "this host has no non-loopback IPv4 address to try";
  auto store = make_store(server(""));
  EXPECT_TRUE(can_connect(*ip, store_port(store)));
}

TEST(StoreTest, BadListenAddressIsOneLine) {
  try {
    make_store(server("localhost"));
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "cannot host the rendezvous store: listen address 'localhost' is not a numeric "
                 "IPv4 or IPv6 address");
  }
}

}  // namespace
