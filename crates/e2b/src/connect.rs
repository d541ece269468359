//! The Connect protocol as E2B's SDKs speak it to envd: the JSON codec
//! (the binary one is translated to it in `codec.rs`),
//! unary calls (a JSON body in, a JSON body out) and server streams
//! (enveloped messages: a flag byte, a big-endian length, the JSON; the
//! last envelope, flagged `0x02`, carries `{}` or the error). Requests may
//! come with a chunked body; an enveloped request is read whole.

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::E2bError;

pub(crate) const END_STREAM: u8 = 0x02;
pub(crate) const COMPRESSED: u8 = 0x01;
/// The largest message taken in one envelope.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// A unary call's request message.
pub(crate) fn unary_request<T: DeserializeOwned>(method: &str, headers: &HeaderMap, body: &[u8]) -> Result<T, E2bError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    if !content_type.starts_with("application/json") {
        return Err(E2bError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("{method}: a Connect request is application/json or application/proto, not {content_type}")));
    }
    decode(method, if body.is_empty() { b"{}" } else { body })
}

/// A unary call's answer.
pub(crate) fn unary_response<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the answer: {e}")).connect_response(),
    }
}

/// The one message of a server-streaming call's request.
pub(crate) fn stream_request<T: DeserializeOwned>(method: &str, body: &[u8]) -> Result<T, E2bError> {
    let mut rest = body;
    match next_envelope(&mut rest)? {
        Some((flags, message)) if flags & END_STREAM == 0 => decode(method, message),
        _ => Err(E2bError::bad_request(format!("{method}: the request has no message"))),
    }
}

/// Splits the next envelope off `rest`: its flags and its message.
pub(crate) fn next_envelope<'a>(rest: &mut &'a [u8]) -> Result<Option<(u8, &'a [u8])>, E2bError> {
    if rest.is_empty() {
        return Ok(None);
    }
    if rest.len() < 5 {
        return Err(E2bError::bad_request(format!("a truncated Connect envelope ({} bytes, the prefix alone is 5)", rest.len())));
    }
    let flags = rest[0];
    let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
    if flags & COMPRESSED != 0 {
        return Err(E2bError::bad_request("a compressed Connect message; only identity encoding is served"));
    }
    if len > MAX_MESSAGE {
        return Err(E2bError::bad_request(format!("a Connect message of {len} bytes; at most {MAX_MESSAGE}")));
    }
    if rest.len() < 5 + len {
        return Err(E2bError::bad_request(format!("a truncated Connect envelope: {len} bytes announced, {} sent", rest.len() - 5)));
    }
    let message = &rest[5..5 + len];
    *rest = &rest[5 + len..];
    Ok(Some((flags, message)))
}

fn decode<T: DeserializeOwned>(method: &str, json: &[u8]) -> Result<T, E2bError> {
    serde_json::from_slice(json).map_err(|e| E2bError::bad_request(format!("{method}: malformed request: {e}")))
}

fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + json.len());
    b.put_u8(flags);
    b.put_u32(json.len() as u32);
    b.put_slice(json);
    b.freeze()
}

/// The sending half of a server stream.
pub(crate) struct StreamSender(mpsc::Sender<Bytes>);

impl StreamSender {
    /// Sends one message; false once the client is gone.
    pub(crate) async fn send<T: Serialize>(&self, message: &T) -> bool {
        match serde_json::to_vec(message) {
            Ok(json) => self.0.send(envelope(0, &json)).await.is_ok(),
            Err(_) => false,
        }
    }

    /// Resolves once the client has gone away.
    pub(crate) async fn closed(&self) {
        self.0.closed().await
    }

    /// Ends the stream, with `error` if it failed.
    pub(crate) async fn end(self, error: Option<&E2bError>) {
        let body = match error {
            Some(e) => e.connect_end_stream(),
            None => serde_json::json!({}),
        };
        let _ = self.0.send(envelope(END_STREAM, body.to_string().as_bytes())).await;
    }
}

/// A server stream's response and the sender that writes it.
pub(crate) fn stream_response() -> (Response, StreamSender) {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let frames = futures_util::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok::<Bytes, std::convert::Infallible>);
    let body = Body::from_stream(frames);
    let response = ([(header::CONTENT_TYPE, "application/connect+json")], body).into_response();
    (response, StreamSender(tx))
}

/// A server stream that fails before its first message.
pub(crate) async fn stream_error(e: E2bError) -> Response {
    let (response, sender) = stream_response();
    sender.end(Some(&e)).await;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_split_and_refuse_truncation_and_compression() {
        let mut body = envelope(0, b"{\"a\":1}").to_vec();
        body.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let mut rest = body.as_slice();
        assert_eq!(next_envelope(&mut rest).unwrap(), Some((0, b"{\"a\":1}".as_slice())));
        assert_eq!(next_envelope(&mut rest).unwrap(), Some((END_STREAM, b"{}".as_slice())));
        assert_eq!(next_envelope(&mut rest).unwrap(), None);
        let mut short: &[u8] = &[0, 0, 0, 0, 9, b'{'];
        assert!(next_envelope(&mut short).unwrap_err().message.contains("truncated"));
        let mut zipped: &[u8] = &[1, 0, 0, 0, 0];
        assert!(next_envelope(&mut zipped).unwrap_err().message.contains("compressed"));
        let mut tiny: &[u8] = &[0, 0];
        assert!(next_envelope(&mut tiny).is_err());
    }
}
