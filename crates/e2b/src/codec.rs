//! The Connect protocol's binary codec, translated at the edge: a request
//! in protobuf (`application/proto`, or `application/connect+proto` for
//! streams) is turned into the JSON the handlers read, and their answer
//! back into protobuf, message by message, using the wire schema in
//! `proto/` (described at build time). Streams are translated as they flow,
//! so a client stream in protobuf feeds its command as it comes. End-of-
//! stream messages and unary errors stay JSON: the protocol has them so.

use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use prost::Message as _;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor, SerializeOptions};

use crate::connect::{COMPRESSED, END_STREAM, MAX_MESSAGE};
use crate::E2bError;

const UNARY_PROTO: &str = "application/proto";
const STREAM_PROTO: &str = "application/connect+proto";

static SCHEMA: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/envd.bin")).as_slice()).map_err(|e| format!("the built-in E2B wire schema is damaged: {e}"))
});

/// The method a request's path names (`/process.Process/Start`).
fn method_of(path: &str) -> Result<Option<MethodDescriptor>, E2bError> {
    let schema = SCHEMA.as_ref().map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.clone()))?;
    let Some((service, method)) = path.trim_start_matches('/').split_once('/') else { return Ok(None) };
    Ok(schema.get_service_by_name(service).and_then(|s| s.methods().find(|m| m.name() == method)))
}

/// Middleware on the in-sandbox API's routes.
pub(crate) async fn translate_binary(req: Request, next: Next) -> Response {
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let streaming = if content_type.starts_with(STREAM_PROTO) {
        true
    } else if content_type.starts_with(UNARY_PROTO) {
        false
    } else {
        return next.run(req).await;
    };
    let method = match method_of(req.uri().path()) {
        Ok(Some(m)) => m,
        // The router answers for a method nobody serves.
        Ok(None) => return next.run(req).await,
        Err(e) => return e.connect_response(),
    };
    let name = format!("{}/{}", method.parent_service().name(), method.name());
    if streaming {
        translate_stream(req, next, method, name).await
    } else {
        translate_unary(req, next, method, name).await
    }
}

async fn translate_unary(req: Request, next: Next, method: MethodDescriptor, name: String) -> Response {
    let (mut parts, body) = req.into_parts();
    let proto = match axum::body::to_bytes(body, MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => return E2bError::bad_request(format!("{name}: cannot read the request: {e}")).connect_response(),
    };
    let json = match proto_to_json(&method.input(), &proto) {
        Ok(j) => j,
        Err(e) => return E2bError::bad_request(format!("{name}: malformed protobuf request: {e}")).connect_response(),
    };
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    let response = next.run(Request::from_parts(parts, Body::from(json))).await;
    // Errors are JSON in both codecs.
    if response.status() != StatusCode::OK {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let json = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{name}: cannot read the answer: {e}")).connect_response(),
    };
    match json_to_proto(&method.output(), &json) {
        Ok(proto) => {
            parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_PROTO));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(proto))
        }
        Err(e) => E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{name}: cannot encode the answer: {e}")).connect_response(),
    }
}

async fn translate_stream(req: Request, next: Next, method: MethodDescriptor, name: String) -> Response {
    let (mut parts, body) = req.into_parts();
    let input = method.input();
    let body = if method.is_client_streaming() {
        // Translated as it comes; a bad message ends the stream the handler reads.
        let name = name.clone();
        Body::from_stream(reframe(body.into_data_stream(), move |m| proto_to_json(&input, m).map_err(|e| format!("{name}: malformed protobuf message: {e}"))))
    } else {
        // One message: translated before the call, so a bad one is refused whole.
        let proto = match axum::body::to_bytes(body, MAX_MESSAGE + 5).await {
            Ok(b) => b,
            Err(e) => return crate::connect::stream_error(E2bError::bad_request(format!("{name}: cannot read the request: {e}"))).await,
        };
        let mut out = BytesMut::new();
        let mut rest = proto.as_ref();
        loop {
            match crate::connect::next_envelope(&mut rest) {
                Ok(Some((flags, message))) if flags & END_STREAM == 0 => match proto_to_json(&input, message) {
                    Ok(json) => put_envelope(&mut out, flags, &json),
                    Err(e) => return crate::connect::stream_error(E2bError::bad_request(format!("{name}: malformed protobuf request: {e}"))).await,
                },
                Ok(Some((flags, message))) => put_envelope(&mut out, flags, message),
                Ok(None) => break,
                Err(e) => return crate::connect::stream_error(e).await,
            }
        }
        Body::from(out.freeze())
    };
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/connect+json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    let response = next.run(Request::from_parts(parts, body)).await;
    let streamed_json = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/connect+json"));
    if !streamed_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let output = method.output();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_PROTO));
    let frames = reframe(body.into_data_stream(), move |m| json_to_proto(&output, m).map_err(|e| format!("{name}: cannot encode a message: {e}")));
    Response::from_parts(parts, Body::from_stream(frames))
}

/// A stream of Connect envelopes with each data message passed through
/// `translate` (end-of-stream envelopes unchanged), whatever the chunking.
fn reframe<S, E>(body: S, translate: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let translate = std::sync::Arc::new(translate);
    futures_util::stream::unfold((body, BytesMut::new(), false), move |(mut body, mut pending, done)| {
        let translate = translate.clone();
        async move {
            if done {
                return None;
            }
            loop {
                // A whole envelope waiting: translate it.
                if pending.len() >= 5 {
                    let flags = pending[0];
                    let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
                    if flags & COMPRESSED != 0 {
                        return Some((Err(bad("a compressed Connect message; only identity encoding is served".into())), (body, pending, true)));
                    }
                    if len > MAX_MESSAGE {
                        return Some((Err(bad(format!("a Connect message of {len} bytes; at most {MAX_MESSAGE}"))), (body, pending, true)));
                    }
                    if pending.len() >= 5 + len {
                        pending.advance(5);
                        let message = pending.split_to(len);
                        let framed = if flags & END_STREAM != 0 {
                            Ok(message.to_vec())
                        } else {
                            translate(&message)
                        };
                        return Some(match framed {
                            Ok(m) => {
                                let mut out = BytesMut::with_capacity(5 + m.len());
                                put_envelope(&mut out, flags, &m);
                                (Ok(out.freeze()), (body, pending, false))
                            }
                            Err(e) => (Err(bad(e)), (body, pending, true)),
                        });
                    }
                }
                match body.next().await {
                    Some(Ok(chunk)) => pending.extend_from_slice(&chunk),
                    Some(Err(e)) => return Some((Err(bad(format!("the stream broke: {e}"))), (body, pending, true))),
                    None if pending.is_empty() => return None,
                    None => {
                        let n = pending.len();
                        return Some((Err(bad(format!("a truncated Connect envelope at the end of the stream ({n} bytes)"))), (body, pending, true)));
                    }
                }
            }
        }
    })
}

fn put_envelope(out: &mut BytesMut, flags: u8, message: &[u8]) {
    out.put_u8(flags);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
}

fn proto_to_json(desc: &MessageDescriptor, proto: &[u8]) -> Result<Vec<u8>, String> {
    let message = DynamicMessage::decode(desc.clone(), proto).map_err(|e| e.to_string())?;
    let mut json = serde_json::Serializer::new(Vec::new());
    message.serialize_with_options(&mut json, &SerializeOptions::new()).map_err(|e| e.to_string())?;
    Ok(json.into_inner())
}

fn json_to_proto(desc: &MessageDescriptor, json: &[u8]) -> Result<Vec<u8>, String> {
    let mut de = serde_json::Deserializer::from_slice(json);
    // Cairn's answers may carry fields E2B's schema lacks.
    let message = DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &DeserializeOptions::new().deny_unknown_fields(false)).map_err(|e| e.to_string())?;
    Ok(message.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(path: &str) -> MethodDescriptor {
        method_of(path).unwrap().unwrap()
    }

    #[test]
    fn the_schema_has_every_served_method() {
        for path in ["/process.Process/Start", "/process.Process/StreamInput", "/filesystem.Filesystem/WatchDir", "/filesystem.Filesystem/Stat"] {
            assert!(method_of(path).unwrap().is_some(), "{path}");
        }
        assert!(method_of("/process.Process/Nope").unwrap().is_none());
        assert!(method("/process.Process/StreamInput").is_client_streaming());
    }

    #[test]
    fn messages_round_trip_between_codecs() {
        let start = method("/process.Process/Start");
        let json = br#"{"process":{"cmd":"/bin/sh","args":["-c","echo hi"],"envs":{"A":"1"},"cwd":"/srv"},"tag":"t","stdin":true}"#;
        let proto = json_to_proto(&start.input(), json).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&proto_to_json(&start.input(), &proto).unwrap()).unwrap();
        assert_eq!(back, serde_json::from_slice::<serde_json::Value>(json).unwrap());
        // An answer with a field the schema lacks still encodes.
        let event = br#"{"event":{"end":{"exitCode":-3,"exited":true,"status":"exit status 253"}},"cairn":1}"#;
        let proto = json_to_proto(&start.output(), event).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&proto_to_json(&start.output(), &proto).unwrap()).unwrap();
        assert_eq!(back["event"]["end"]["exitCode"], -3);
        let stat = method("/filesystem.Filesystem/Stat");
        let entry = br#"{"entry":{"name":"a","type":"FILE_TYPE_FILE","path":"/a","size":"12","modifiedTime":"2026-01-02T03:04:05Z"}}"#;
        let proto = json_to_proto(&stat.output(), entry).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&proto_to_json(&stat.output(), &proto).unwrap()).unwrap();
        assert_eq!(back["entry"]["size"], "12");
        assert_eq!(back["entry"]["modifiedTime"], "2026-01-02T03:04:05Z");
    }

    #[test]
    fn malformed_protobuf_is_refused() {
        let start = method("/process.Process/Start");
        // Field 1 announced as a 100-byte message with 2 bytes behind it.
        assert!(proto_to_json(&start.input(), &[0x0a, 100, 1, 2]).is_err());
        // A wire type 7 does not exist.
        assert!(proto_to_json(&start.input(), &[0x0f]).is_err());
    }

    #[tokio::test]
    async fn reframing_survives_any_chunking_and_refuses_truncation() {
        let mut whole = BytesMut::new();
        put_envelope(&mut whole, 0, b"abc");
        put_envelope(&mut whole, 0, b"");
        put_envelope(&mut whole, END_STREAM, b"{}");
        let whole = whole.freeze();
        for size in 1..whole.len() {
            let chunks: Vec<Result<Bytes, std::io::Error>> = whole.chunks(size).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let out: Vec<_> = reframe(futures_util::stream::iter(chunks), |m| Ok(m.to_ascii_uppercase())).collect().await;
            let out: Vec<u8> = out.into_iter().flat_map(|r| r.unwrap().to_vec()).collect();
            let mut expected = BytesMut::new();
            put_envelope(&mut expected, 0, b"ABC");
            put_envelope(&mut expected, 0, b"");
            put_envelope(&mut expected, END_STREAM, b"{}");
            assert_eq!(out, expected.to_vec(), "chunks of {size}");
        }
        let cut = vec![Ok::<_, std::io::Error>(whole.slice(..6))];
        let out: Vec<_> = reframe(futures_util::stream::iter(cut), |m| Ok(m.to_vec())).collect().await;
        assert!(out.last().unwrap().as_ref().unwrap_err().to_string().contains("truncated"));
    }
}
