//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) over the descriptors the API
//! protos compile to, so that grpcurl, grpcio-reflection and similar tools list and describe
//! the services without a .proto file. Sans-I/O: [`Reflection::answer`] maps one request to
//! its response; the broker streams them.
//!
//! v1alpha has the same messages as v1 under another package name, hence the same bytes on
//! the wire: one implementation serves both paths.

use std::collections::{BTreeSet, HashMap};

use prost::Message;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

use crate::grpc::Code;
use crate::pb::reflection::server_reflection_request::MessageRequest;
use crate::pb::reflection::server_reflection_response::MessageResponse;
use crate::pb::reflection::{
    ErrorResponse, ExtensionNumberResponse, FileDescriptorResponse, ListServiceResponse,
    ServerReflectionRequest, ServerReflectionResponse, ServiceResponse,
};

/// The encoded `FileDescriptorSet` of every proto this crate compiles (the API, health and
/// reflection itself).
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// Method path of v1 reflection.
pub const V1_METHOD: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
/// Method path of v1alpha reflection (older clients, grpcio-reflection's descriptor database).
pub const V1ALPHA_METHOD: &str = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
/// The reflection services, for a server's list of the services it implements.
pub const SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Why a reflection index cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReflectionError {
    /// The descriptor set does not decode.
    #[error("the descriptor set does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A service to list is defined in none of the files.
    #[error("service {0} is not in the descriptor set")]
    UnknownService(String),
}

struct File {
    encoded: bytes::Bytes,
    dependencies: Vec<String>,
}

/// Files by name, and the file defining each symbol.
///
/// Invariant: every listed service and every symbol maps to a file of the set.
pub struct Reflection {
    services: Vec<String>,
    files: HashMap<String, File>,
    symbols: HashMap<String, String>,
    messages: BTreeSet<String>,
}

impl Reflection {
    /// An index of `set` (an encoded `FileDescriptorSet`) that lists `services`.
    ///
    /// # Errors
    /// The set does not decode, or a service is not defined in it.
    pub fn new(set: &[u8], services: &[&str]) -> Result<Reflection, ReflectionError> {
        let set = FileDescriptorSet::decode(set)?;
        let mut r = Reflection {
            services: Vec::new(),
            files: HashMap::new(),
            symbols: HashMap::new(),
            messages: BTreeSet::new(),
        };
        for f in set.file {
            r.index_file(f);
        }
        for s in services {
            if !r.symbols.contains_key(*s) {
                return Err(ReflectionError::UnknownService((*s).to_owned()));
            }
            r.services.push((*s).to_owned());
        }
        r.services.sort();
        r.services.dedup();
        Ok(r)
    }

    fn index_file(&mut self, f: FileDescriptorProto) {
        let name = f.name().to_owned();
        let package = f.package().to_owned();
        let scoped = |n: &str| {
            if package.is_empty() {
                n.to_owned()
            } else {
                format!("{package}.{n}")
            }
        };
        let mut symbols = Vec::new();
        for m in &f.message_type {
            message_symbols(&scoped(m.name()), m, &mut symbols, &mut self.messages);
        }
        for e in &f.enum_type {
            enum_symbols(&scoped(e.name()), &package, e, &mut symbols);
        }
        for s in &f.service {
            let service = scoped(s.name());
            for m in &s.method {
                symbols.push(format!("{service}.{}", m.name()));
            }
            symbols.push(service);
        }
        for s in symbols {
            self.symbols.insert(s, name.clone());
        }
        let file = File {
            encoded: f.encode_to_vec().into(),
            dependencies: f.dependency.clone(),
        };
        self.files.insert(name, file);
    }

    /// The response to one request (errors are responses too, as the protocol has them).
    #[must_use]
    pub fn answer(&self, req: ServerReflectionRequest) -> ServerReflectionResponse {
        let response = match &req.message_request {
            Some(MessageRequest::ListServices(_)) => {
                MessageResponse::ListServicesResponse(ListServiceResponse {
                    service: self
                        .services
                        .iter()
                        .map(|name| ServiceResponse { name: name.clone() })
                        .collect(),
                })
            }
            Some(MessageRequest::FileByFilename(name)) => self.file_with_dependencies(name),
            Some(MessageRequest::FileContainingSymbol(symbol)) => {
                match self.symbols.get(symbol.trim_start_matches('.')) {
                    Some(file) => self.file_with_dependencies(file),
                    None => error(
                        Code::NotFound,
                        format!("symbol {} not found", shown(symbol)),
                    ),
                }
            }
            Some(MessageRequest::FileContainingExtension(e)) => error(
                Code::NotFound,
                format!(
                    "no extension {} of {}: this server defines no extensions",
                    e.extension_number,
                    shown(&e.containing_type)
                ),
            ),
            Some(MessageRequest::AllExtensionNumbersOfType(t)) => {
                let t = t.trim_start_matches('.');
                if self.messages.contains(t) {
                    MessageResponse::AllExtensionNumbersResponse(ExtensionNumberResponse {
                        base_type_name: t.to_owned(),
                        extension_number: Vec::new(),
                    })
                } else {
                    error(
                        Code::NotFound,
                        format!("message type {} not found", shown(t)),
                    )
                }
            }
            None => error(
                Code::InvalidArgument,
                "the request names no message_request (list_services, file_by_filename, \
                 file_containing_symbol, ...)"
                    .into(),
            ),
        };
        ServerReflectionResponse {
            valid_host: req.host.clone(),
            original_request: Some(req),
            message_response: Some(response),
        }
    }

    /// The file named `name` first, then every file it depends on, transitively.
    fn file_with_dependencies(&self, name: &str) -> MessageResponse {
        if !self.files.contains_key(name) {
            return error(Code::NotFound, format!("file {} not found", shown(name)));
        }
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut next = vec![name.to_owned()];
        while let Some(n) = next.pop() {
            if !seen.insert(n.clone()) {
                continue;
            }
            // A dependency outside the set (none today) is left to the client to resolve.
            if let Some(f) = self.files.get(&n) {
                out.push(f.encoded.clone());
                next.extend(f.dependencies.iter().rev().cloned());
            }
        }
        MessageResponse::FileDescriptorResponse(FileDescriptorResponse {
            file_descriptor_proto: out,
        })
    }
}

/// A message's own name, its fields, nested messages and enums.
fn message_symbols(
    full: &str,
    m: &DescriptorProto,
    out: &mut Vec<String>,
    messages: &mut BTreeSet<String>,
) {
    out.push(full.to_owned());
    messages.insert(full.to_owned());
    for f in &m.field {
        out.push(format!("{full}.{}", f.name()));
    }
    for o in &m.oneof_decl {
        out.push(format!("{full}.{}", o.name()));
    }
    for n in &m.nested_type {
        message_symbols(&format!("{full}.{}", n.name()), n, out, messages);
    }
    for e in &m.enum_type {
        enum_symbols(&format!("{full}.{}", e.name()), full, e, out);
    }
}

/// An enum and its values: protobuf scopes the values beside the enum (`pkg.VALUE`), and
/// tools also ask for them under the enum (`pkg.Enum.VALUE`).
fn enum_symbols(
    full: &str,
    parent: &str,
    e: &prost_types::EnumDescriptorProto,
    out: &mut Vec<String>,
) {
    out.push(full.to_owned());
    for v in &e.value {
        if parent.is_empty() {
            out.push(v.name().to_owned());
        } else {
            out.push(format!("{parent}.{}", v.name()));
        }
        out.push(format!("{full}.{}", v.name()));
    }
}

/// A name from a request, cut for an error message (the response echoes the request, and must
/// stay within the send limit).
fn shown(name: &str) -> String {
    const SHOWN_MAX: usize = 256;
    match name.char_indices().nth(SHOWN_MAX) {
        Some((at, _)) => format!("{:?}…", &name[..at]),
        None => format!("{name:?}"),
    }
}

fn error(code: Code, message: String) -> MessageResponse {
    MessageResponse::ErrorResponse(ErrorResponse {
        error_code: code as i32,
        error_message: message,
    })
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_types::FileDescriptorProto;

    use super::{Reflection, ReflectionError, DESCRIPTORS, SERVICES};
    use crate::grpc::Code;
    use crate::pb::reflection::server_reflection_request::MessageRequest;
    use crate::pb::reflection::server_reflection_response::MessageResponse;
    use crate::pb::reflection::{ExtensionRequest, ServerReflectionRequest};

    fn index() -> Reflection {
        let mut services = vec!["futureq.FutureQProducer", "grpc.health.v1.Health"];
        services.extend(SERVICES);
        Reflection::new(DESCRIPTORS, &services).unwrap()
    }

    fn ask(r: &Reflection, m: MessageRequest) -> MessageResponse {
        let req = ServerReflectionRequest {
            host: "h".into(),
            message_request: Some(m.clone()),
        };
        let resp = r.answer(req);
        assert_eq!(resp.valid_host, "h");
        assert_eq!(
            resp.original_request.and_then(|o| o.message_request),
            Some(m),
            "the request is echoed"
        );
        resp.message_response.unwrap()
    }

    fn files(m: MessageResponse) -> Vec<FileDescriptorProto> {
        let MessageResponse::FileDescriptorResponse(f) = m else {
            panic!("not a file response: {m:?}");
        };
        f.file_descriptor_proto
            .iter()
            .map(|b| FileDescriptorProto::decode(b.as_ref()).unwrap())
            .collect()
    }

    fn error_code(m: MessageResponse) -> i32 {
        let MessageResponse::ErrorResponse(e) = m else {
            panic!("not an error: {m:?}");
        };
        e.error_code
    }

    #[test]
    fn lists_the_services_sorted() {
        let MessageResponse::ListServicesResponse(l) =
            ask(&index(), MessageRequest::ListServices(String::new()))
        else {
            panic!("not a list");
        };
        let names: Vec<&str> = l.service.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "futureq.FutureQProducer",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ]
        );
    }

    #[test]
    fn a_symbol_of_any_kind_gives_its_file() {
        let r = index();
        for symbol in [
            "futureq.FutureQProducer",
            "futureq.FutureQProducer.PublishStream",
            ".futureq.PublishBatch",
            "futureq.PublishMessage.topic",
            "futureq.AckLevel",
            "grpc.health.v1.HealthCheckResponse.ServingStatus",
            "grpc.health.v1.HealthCheckResponse.SERVING",
            "grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING",
            "futureq.Index.value",
            "futureq.ACK_LEVEL_QUORUM",
        ] {
            let f = files(ask(&r, MessageRequest::FileContainingSymbol(symbol.into())));
            let want = if symbol.contains("health") {
                "health.proto"
            } else {
                "futureq.proto"
            };
            assert_eq!(f[0].name(), want, "{symbol}");
        }
        let f = files(ask(
            &r,
            MessageRequest::FileByFilename("reflection_v1alpha.proto".into()),
        ));
        assert_eq!(f[0].package(), "grpc.reflection.v1alpha");
        assert_eq!(
            f[0].service[0].method[0].input_type(),
            ".grpc.reflection.v1alpha.ServerReflectionRequest",
            "v1alpha's types are its own"
        );
        let resp = f[0]
            .message_type
            .iter()
            .find(|m| m.name() == "ServerReflectionResponse")
            .unwrap();
        assert!(resp
            .field
            .iter()
            .filter_map(|f| f.type_name.as_deref())
            .all(|t| t.starts_with(".grpc.reflection.v1alpha.")));
    }

    #[test]
    fn unknown_names_and_empty_requests_are_error_responses() {
        let r = index();
        let not_found = Code::NotFound as i32;
        for m in [
            MessageRequest::FileContainingSymbol("futureq.Nope".into()),
            MessageRequest::FileByFilename("nope.proto".into()),
            MessageRequest::AllExtensionNumbersOfType("futureq.Nope".into()),
            MessageRequest::FileContainingExtension(ExtensionRequest {
                containing_type: "futureq.PublishBatch".into(),
                extension_number: 100,
            }),
        ] {
            assert_eq!(error_code(ask(&r, m)), not_found);
        }
        let MessageResponse::AllExtensionNumbersResponse(e) = ask(
            &r,
            MessageRequest::AllExtensionNumbersOfType("futureq.PublishBatch".into()),
        ) else {
            panic!("a known message has an (empty) extension list");
        };
        assert!(e.extension_number.is_empty());
        let long = ask(
            &r,
            MessageRequest::FileContainingSymbol("x".repeat(1 << 20)),
        );
        let MessageResponse::ErrorResponse(e) = long else {
            panic!("not an error");
        };
        assert!(
            e.error_message.len() < 400,
            "the name is cut in the message"
        );
        let empty = r.answer(ServerReflectionRequest::default());
        assert_eq!(
            error_code(empty.message_response.unwrap()),
            Code::InvalidArgument as i32
        );
    }

    #[test]
    fn a_service_outside_the_set_or_damaged_bytes_are_refused() {
        assert!(matches!(
            Reflection::new(DESCRIPTORS, &["futureq.Nope"]),
            Err(ReflectionError::UnknownService(_))
        ));
        assert!(matches!(
            Reflection::new(&[0xff, 0xff], &[]),
            Err(ReflectionError::Decode(_))
        ));
    }
}
