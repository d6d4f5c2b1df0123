//! The structured-output fields of both APIs as one [`Format`]: Ollama's
//! `format`, OpenAI's `response_format`, and llama.cpp's server's
//! `json_schema` and `grammar` extensions. The engine compiles the format
//! (a grammar it cannot use is a 400 from `Engine::prepare`).

use m40_runtime::Format;
use serde_json::Value;

use crate::ApiError;

/// Ollama's `format`: `"json"`, or a JSON schema; null or `""` ask for
/// nothing.
pub(crate) fn ollama(format: Option<&Value>) -> Result<Option<Format>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Format::Json)),
        Some(v @ Value::Object(_)) => Ok(Some(Format::JsonSchema(v.clone()))),
        Some(v) => Err(ApiError::bad_request(format!(
            "format must be \"json\" or a JSON schema (an object), not {v}"
        ))),
    }
}

/// OpenAI's `response_format` (`text`, `json_object`, `json_schema` with
/// its `schema`; llama.cpp's `json_object` with a `schema` too), or
/// llama.cpp's `json_schema` (a schema) or `grammar` (GBNF): at most one.
pub(crate) fn openai(
    response_format: Option<&Value>,
    json_schema: Option<&Value>,
    grammar: Option<&str>,
) -> Result<Option<Format>, ApiError> {
    let from_response = match response_format.filter(|f| !f.is_null()) {
        None => None,
        Some(f) => {
            let kind = f.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" => None,
                "json_object" => Some(match f.get("schema") {
                    Some(s @ Value::Object(_)) => Format::JsonSchema(s.clone()),
                    _ => Format::Json,
                }),
                "json_schema" => {
                    let schema = f
                        .get("json_schema")
                        .and_then(|j| j.get("schema"))
                        .or_else(|| f.get("schema"));
                    match schema {
                        Some(s @ Value::Object(_)) => Some(Format::JsonSchema(s.clone())),
                        Some(Value::Bool(true)) | None => Some(Format::Json),
                        Some(s) => {
                            return Err(ApiError::bad_request(format!(
                                "response_format.json_schema.schema must be an object, not {s}"
                            )))
                        }
                    }
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "response_format.type must be \"text\", \"json_object\" or \"json_schema\", not {}",
                        f.get("type").unwrap_or(&Value::Null)
                    )))
                }
            }
        }
    };
    let from_schema = match json_schema.filter(|s| !s.is_null()) {
        None => None,
        Some(s @ Value::Object(_)) => Some(Format::JsonSchema(s.clone())),
        Some(s) => {
            return Err(ApiError::bad_request(format!(
                "json_schema must be a JSON schema (an object), not {s}"
            )))
        }
    };
    let from_grammar = grammar
        .filter(|g| !g.trim().is_empty())
        .map(|g| Format::Gbnf(g.to_string()));
    let mut given: Vec<Format> = [from_response, from_schema, from_grammar]
        .into_iter()
        .flatten()
        .collect();
    if given.len() > 1 {
        return Err(ApiError::bad_request(
            "give one of response_format, json_schema and grammar, not several",
        ));
    }
    Ok(given.pop())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollama_formats() {
        assert_eq!(ollama(None).unwrap(), None);
        assert_eq!(ollama(Some(&json!(""))).unwrap(), None);
        assert_eq!(ollama(Some(&json!("json"))).unwrap(), Some(Format::Json));
        let s = json!({"type": "object"});
        assert_eq!(
            ollama(Some(&s)).unwrap(),
            Some(Format::JsonSchema(s.clone()))
        );
        assert!(ollama(Some(&json!("yaml"))).is_err());
        assert!(ollama(Some(&json!(5))).is_err());
    }

    #[test]
    fn openai_formats() {
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}});
        assert_eq!(
            openai(Some(&rf), None, None).unwrap(),
            Some(Format::JsonSchema(s.clone()))
        );
        let jo = json!({"type": "json_object"});
        assert_eq!(openai(Some(&jo), None, None).unwrap(), Some(Format::Json));
        assert_eq!(
            openai(Some(&json!({"type": "text"})), None, None).unwrap(),
            None
        );
        assert_eq!(
            openai(None, Some(&s), None).unwrap(),
            Some(Format::JsonSchema(s.clone()))
        );
        assert_eq!(
            openai(None, None, Some("root ::= \"a\"")).unwrap(),
            Some(Format::Gbnf("root ::= \"a\"".into()))
        );
        assert!(openai(Some(&json!({"type": "yaml"})), None, None).is_err());
        assert!(openai(Some(&jo), Some(&s), None).is_err());
        let bad = json!({"type": "json_schema", "json_schema": {"schema": 3}});
        assert!(openai(Some(&bad), None, None).is_err());
    }
}
