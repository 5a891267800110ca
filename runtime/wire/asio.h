// Boost.Asio under the short name `asio::`, the one way the project includes it.
//
// The project moved from standalone Asio to Boost.Asio (the same API) so that Boost.Beast can
// serve HTTP on the same event loop; this header keeps the spelling `asio::ip::tcp::socket`,
// `asio::error_code` etc. Include it instead of <boost/asio.hpp>.
#ifndef CHUNKSERVE_RUNTIME_WIRE_ASIO_H_
#define CHUNKSERVE_RUNTIME_WIRE_ASIO_H_

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio.hpp>
#include <boost/system/error_code.hpp>

namespace asio {
using namespace boost::asio;  // NOLINT(google-build-using-namespace): the alias namespace
using error_code = boost::system::error_code;
}  // namespace asio

#endif  // CHUNKSERVE_RUNTIME_WIRE_ASIO_H_
