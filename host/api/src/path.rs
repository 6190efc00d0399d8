//! Request paths: every variable part (a task id) is one percent-encoded segment.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Bytes left as they are in a segment: RFC 3986's unreserved characters. Everything
/// else, `/`, `%`, `?`, `#`, spaces and every non-ASCII byte included, is encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` as one path segment: the agent decodes it back to `text`, whatever it
/// contains, and it never reaches another endpoint. `.` and `..`, which a path would
/// treat as "this" and "parent", are encoded too.
///
/// ```
/// use drover_api::encode_path_segment as seg;
/// assert_eq!(seg("5f0c9a"), "5f0c9a");
/// assert_eq!(seg("../../x"), "..%2F..%2Fx");
/// assert_eq!(seg(".."), "%2E%2E");
/// assert_eq!(seg("a b%"), "a%20b%25");
/// ```
pub fn encode_path_segment(text: &str) -> String {
    if text == "." || text == ".." {
        return "%2E".repeat(text.len());
    }
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// `/` followed by the segments, each encoded.
pub(crate) fn path(segments: &[&str]) -> String {
    let mut out = String::new();
    for s in segments {
        out.push('/');
        out.push_str(&encode_path_segment(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_whole() {
        for (id, want) in [
            ("5f0c9a1e", "5f0c9a1e"),
            ("web-1.v2_x~y", "web-1.v2_x~y"),
            ("a/b", "a%2Fb"),
            ("a b", "a%20b"),
            ("..", "%2E%2E"),
            (".", "%2E"),
            ("...", "..."),
            ("../../x", "..%2F..%2Fx"),
            ("100%", "100%25"),
            ("%2F", "%252F"),
            ("ünï/cödé", "%C3%BCn%C3%AF%2Fc%C3%B6d%C3%A9"),
            ("日本", "%E6%97%A5%E6%9C%AC"),
            ("q?x=1&y#z", "q%3Fx%3D1%26y%23z"),
            ("tab\there\nnl", "tab%09here%0Anl"),
            ("a+b;c,d:e@f", "a%2Bb%3Bc%2Cd%3Ae%40f"),
        ] {
            assert_eq!(encode_path_segment(id), want, "{id:?}");
        }
    }

    #[test]
    fn encoded_segments_decode_back_and_make_a_valid_path() {
        for id in [
            "a b",
            "../../x",
            "..",
            ".",
            "%",
            "%%41",
            "ünï/cödé",
            "a/b/../c",
            "\u{0}",
        ] {
            let seg = encode_path_segment(id);
            assert!(!seg.contains('/'), "{seg}");
            let decoded = percent_encoding::percent_decode_str(&seg)
                .decode_utf8()
                .unwrap();
            assert_eq!(decoded, id);
            let p = path(&["v1", "tasks", id, "logs"]);
            let uri: http::Uri = format!("unix://00:0{p}").parse().unwrap();
            assert_eq!(uri.path(), p);
            assert_eq!(uri.path().split('/').count(), 5, "{p}");
        }
        assert_eq!(path(&["v1", "tasks"]), "/v1/tasks");
    }
}
