//! Field schemas that serde-shaped types cannot say (one of several shapes, PEFT names): the
//! request types name them with `#[schema(schema_with = …)]`.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};

use super::super::openai;
use crate::model::Projection;

fn null() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Null)
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn token_id() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .maximum(Some(u32::MAX))
}

fn array(items: impl Into<RefOr<Schema>>) -> ArrayBuilder {
    ArrayBuilder::new().items(items.into())
}

/// Token ids: at least one, each in the vocabulary (checked against the model served).
fn tokens() -> ArrayBuilder {
    array(token_id()).min_items(Some(1))
}

/// `prompt` of `/v1/completions`: a text or token ids, or a batch of exactly one of either.
pub(in crate::server) fn completion_prompt() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(string())
        .item(array(string()).min_items(Some(1)).max_items(Some(1)))
        .item(tokens())
        .item(array(tokens()).min_items(Some(1)).max_items(Some(1)))
        .description(Some(
            "one prompt: a text or token ids (a batch of one is accepted; send each prompt \
             as its own request, the server batches them)",
        ))
}

/// `prompt` of a training client's `sample`: a text or token ids.
pub(in crate::server) fn sample_prompt() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new().item(string()).item(tokens())
}

/// `stop`: one string or at most four, each at most 512 bytes.
pub(in crate::server) fn stop() -> impl Into<RefOr<Schema>> {
    let one = || {
        string()
            .max_length(Some(openai::MAX_STOP_BYTES))
            .description(Some("at most 512 bytes of UTF-8"))
    };
    OneOfBuilder::new()
        .item(one())
        .item(array(one()).max_items(Some(openai::MAX_STOP_SEQUENCES)))
        .item(null())
}

/// A chat message's `content`: text, parts whose `text` is joined, or null.
pub(in crate::server) fn chat_content() -> impl Into<RefOr<Schema>> {
    let part = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("type", string())
        .property("text", string());
    OneOfBuilder::new()
        .item(string())
        .item(array(part))
        .item(null())
}

/// PEFT's module names.
pub(in crate::server) fn target_modules() -> impl Into<RefOr<Schema>> {
    let name = string().enum_values(Some(Projection::ALL.iter().map(|p| p.name())));
    OneOfBuilder::new()
        .item(array(name).min_items(Some(1)))
        .item(null())
        .description(Some("the projections to adapt [default: all seven]"))
}

/// `betas` of AdamW, each in [0, 1) [default: [0.9, 0.999]].
pub(in crate::server) fn betas() -> impl Into<RefOr<Schema>> {
    let beta = ObjectBuilder::new()
        .schema_type(Type::Number)
        .minimum(Some(0))
        .exclusive_maximum(Some(1));
    OneOfBuilder::new()
        .item(array(beta).min_items(Some(2)).max_items(Some(2)))
        .item(null())
}

/// `loss_mask`: a weight per token of each sequence.
pub(in crate::server) fn loss_mask() -> impl Into<RefOr<Schema>> {
    let weight = ObjectBuilder::new().schema_type(Type::Number);
    OneOfBuilder::new()
        .item(array(array(weight)))
        .item(null())
        .description(Some(
            "weights of each token as a target [default: all but the first]",
        ))
}

/// `ask_wei_per_s`: integer wei, as a decimal string or a number, above zero.
pub(in crate::server) fn wei() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(string().pattern(Some("^[0-9]+$")).max_length(Some(20)))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(u64::MAX)),
        )
}
