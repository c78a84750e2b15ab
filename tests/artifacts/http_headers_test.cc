#include "artifacts/http_headers.h"

#include <gtest/gtest.h>

namespace cubist {
namespace {

TEST(HttpHeadersTest, RetryAfterTakesSecondsOnly) {
  EXPECT_EQ(RetryAfterFromHeaderLine("Retry-After: 7\r\n"), absl::Seconds(7));
  EXPECT_EQ(RetryAfterFromHeaderLine("retry-after:0\r\n"), absl::Seconds(0));
  EXPECT_EQ(RetryAfterFromHeaderLine("Retry-After: -1\r\n"), std::nullopt);
  EXPECT_EQ(RetryAfterFromHeaderLine("Retry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n"),
            std::nullopt);
  EXPECT_EQ(RetryAfterFromHeaderLine("ETag: \"7\"\r\n"), std::nullopt);
}

TEST(HttpHeadersTest, ContentRangeStartIsTheFirstByte) {
  EXPECT_EQ(ContentRangeStartFromHeaderLine("Content-Range: bytes 100-199/200\r\n"), 100u);
  EXPECT_EQ(ContentRangeStartFromHeaderLine("content-range:bytes 0-0/1\r\n"), 0u);
  EXPECT_EQ(ContentRangeStartFromHeaderLine("Content-Range: items 1-2/3\r\n"), std::nullopt);
  EXPECT_EQ(ContentRangeStartFromHeaderLine("Content-Range: bytes */200\r\n"), std::nullopt);
  EXPECT_EQ(ContentRangeStartFromHeaderLine("Content-Length: 100\r\n"), std::nullopt);
}

TEST(HttpHeadersTest, ResponseHeadersKeepTheLastResponseOnly) {
  ResponseHeaders h;
  h.AddLine("HTTP/1.1 302 Found\r\n");
  h.AddLine("Retry-After: 3\r\n");
  h.AddLine("ETag: \"old\"\r\n");
  h.AddLine("Content-Range: bytes 5-9/10\r\n");
  EXPECT_EQ(h.retry_after, absl::Seconds(3));
  EXPECT_EQ(h.etag, "\"old\"");
  EXPECT_EQ(h.content_range_start, 5u);

  h.AddLine("HTTP/2 206\r\n");  // the redirect's target answers
  EXPECT_EQ(h.retry_after, std::nullopt);
  EXPECT_EQ(h.etag, std::nullopt);
  EXPECT_EQ(h.content_range_start, std::nullopt);
  h.AddLine("content-range: bytes 40-49/50\r\n");
  h.AddLine("Content-Type: application/octet-stream\r\n");
  h.AddLine("\r\n");
  EXPECT_EQ(h.content_range_start, 40u);
  EXPECT_EQ(h.retry_after, std::nullopt);
}

}  // namespace
}  // namespace cubist
