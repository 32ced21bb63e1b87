//! Derive macros for tracejit.
//!
//! `#[derive(Nest)]` lets a user struct be a `Function`'s argument or
//! result: its fields flatten in declaration order, exactly as a tuple of the
//! same fields would, and each tensor leaf's path names the field (`state.h`;
//! ONNX export names graph inputs and outputs with these paths).
//!
//! `#[derive(Module)]` makes a struct a `tracejit::module::Module`: its walk
//! visits the fields in declaration order, each under a `Field` path segment
//! (a tuple struct's fields are named `0`, `1`, ...), skipping those marked
//! `#[module(skip)]`.
//!
//! Both emit `::tracejit::...` paths; the facade re-exports what they name,
//! and crates below it that use a derive declare `extern crate self as
//! tracejit;` with the same items.

use proc_macro::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

/// Implements `tracejit::Nest` for a struct (named, tuple or unit) whose
/// fields are all nests.
#[proc_macro_derive(Nest)]
pub fn derive_nest(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match nest_impl(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn nest_impl(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let name = &input.ident;
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "#[derive(Nest)] supports structs; wrap enum cases in Option or Static",
        ));
    };
    let mut generics = input.generics.clone();
    for p in generics.type_params_mut() {
        p.bounds.push(syn::parse_quote!(::tracejit::Nest));
    }
    let (impl_g, ty_g, where_g) = generics.split_for_impl();
    let (flatten, unflatten, paths) = match &data.fields {
        Fields::Named(f) => {
            let idents: Vec<_> = f.named.iter().map(|f| f.ident.clone().expect("named")).collect();
            let types: Vec<_> = f.named.iter().map(|f| &f.ty).collect();
            let names: Vec<String> =
                idents.iter().map(|i| i.to_string().trim_start_matches("r#").to_string()).collect();
            (
                quote! { #( ::tracejit::Nest::flatten(&self.#idents, out); )* },
                quote! { #name { #( #idents: <#types as ::tracejit::Nest>::unflatten(src), )* } },
                quote! { #( ::tracejit::Nest::leaf_paths(&self.#idents, &::tracejit::nest_join_field(path, #names), out); )* },
            )
        }
        Fields::Unnamed(f) => {
            let idx: Vec<syn::Index> = (0..f.unnamed.len()).map(syn::Index::from).collect();
            let types: Vec<_> = f.unnamed.iter().map(|f| &f.ty).collect();
            let vars: Vec<_> = (0..f.unnamed.len()).map(|i| format_ident!("f{i}")).collect();
            let names: Vec<String> = (0..f.unnamed.len()).map(|i| i.to_string()).collect();
            (
                quote! { #( ::tracejit::Nest::flatten(&self.#idx, out); )* },
                quote! {{
                    #( let #vars = <#types as ::tracejit::Nest>::unflatten(src); )*
                    #name( #(#vars),* )
                }},
                quote! { #( ::tracejit::Nest::leaf_paths(&self.#idx, &::tracejit::nest_join_field(path, #names), out); )* },
            )
        }
        Fields::Unit => (quote! {}, quote! { #name }, quote! {}),
    };
    Ok(quote! {
        impl #impl_g ::tracejit::Nest for #name #ty_g #where_g {
            fn flatten<'tracejit_a>(&'tracejit_a self, out: &mut ::tracejit::Flattener<'tracejit_a>) {
                let _ = &out;
                #flatten
            }
            fn unflatten(src: &mut ::tracejit::Unflattener) -> Self {
                let _ = &src;
                #unflatten
            }
            fn leaf_paths(&self, path: &str, out: &mut ::std::vec::Vec<::std::string::String>) {
                let _ = (&path, &out);
                #paths
            }
        }
    })
}

/// Implements `tracejit::module::Module` and `tracejit::module::Visit` for a
/// struct whose fields are variables, modules, or containers of them (`Vec`,
/// arrays, `Option`, `Box`, `Arc`, `Rc`, `BTreeMap<String, _>`).
///
/// Attributes:
/// - `#[module(skip)]` on a field: the field holds no state and is ignored
///   (its type needs no trait).
/// - `#[module(name = "...")]` on the struct: the module's name (default: the
///   type name in snake_case).
/// - `#[module(name)]` on a field: the field's value (`ToString`) is this
///   instance's name; the field is not walked.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match module_impl(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What a field's `#[module(...)]` attributes ask for.
#[derive(Default)]
struct FieldAttrs {
    skip: bool,
    name: bool,
}

fn field_attrs(field: &syn::Field) -> syn::Result<FieldAttrs> {
    let mut out = FieldAttrs::default();
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                out.skip = true;
                Ok(())
            } else if meta.path.is_ident("name") {
                out.name = true;
                Ok(())
            } else {
                Err(meta.error("expected `skip` or `name` in #[module(...)] on a field"))
            }
        })?;
    }
    Ok(out)
}

fn struct_name_attr(input: &DeriveInput) -> syn::Result<Option<LitStr>> {
    let mut name = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                name = Some(meta.value()?.parse::<LitStr>()?);
                Ok(())
            } else {
                Err(meta.error("expected `name = \"...\"` in #[module(...)] on a struct"))
            }
        })?;
    }
    Ok(name)
}

fn module_impl(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let ident = &input.ident;
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(input, "#[derive(Module)] supports structs"));
    };
    let fields: Vec<(String, proc_macro2::TokenStream, &syn::Field)> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| {
                let id = f.ident.clone().expect("named");
                let key = id.to_string();
                let key = key.strip_prefix("r#").unwrap_or(&key).to_string();
                (key, quote! { #id }, f)
            })
            .collect(),
        Fields::Unnamed(f) => f
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let idx = syn::Index::from(i);
                (i.to_string(), quote! { #idx }, f)
            })
            .collect(),
        Fields::Unit => Vec::new(),
    };

    let type_params: Vec<String> = input.generics.type_params().map(|p| p.ident.to_string()).collect();
    let mut visits = Vec::new();
    let mut bounds = Vec::new();
    let mut name_field = None;
    for (key, access, field) in &fields {
        let attrs = field_attrs(field)?;
        if attrs.name {
            if name_field.is_some() {
                return Err(syn::Error::new_spanned(field, "only one field may be #[module(name)]"));
            }
            name_field = Some(access.clone());
            continue;
        }
        if attrs.skip {
            continue;
        }
        let ty = &field.ty;
        // Bound only the field types that name a type parameter: the others
        // are checked where they are visited, and bounding them could expose
        // a private type in a public impl's where clause.
        if mentions_any(ty, &type_params) {
            bounds.push(quote! { #ty: ::tracejit::module::Visit });
        }
        // Spanned on the field's type, so "not Visit" points at the field.
        let visit = quote_spanned! {ty.span()=> ::tracejit::module::Visit::visit(&self.#access, visitor); };
        visits.push(quote! {
            visitor.enter(::tracejit::module::Segment::Field(#key));
            #visit
            visitor.exit(::tracejit::module::Segment::Field(#key));
        });
    }

    let struct_name = struct_name_attr(input)?;
    let name_fn = match (name_field, struct_name) {
        (Some(_), Some(lit)) => {
            return Err(syn::Error::new_spanned(lit, "use either #[module(name = \"...\")] or a #[module(name)] field"))
        }
        (Some(access), None) => quote! {
            fn name(&self) -> ::std::string::String {
                ::std::string::ToString::to_string(&self.#access)
            }
        },
        (None, Some(lit)) => quote! {
            fn name(&self) -> ::std::string::String {
                ::std::string::String::from(#lit)
            }
        },
        (None, None) => quote! {},
    };

    let type_name = ident.to_string();
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let mut where_clause = where_g.cloned().unwrap_or_else(|| syn::parse_quote!(where));
    for b in &bounds {
        where_clause.predicates.push(syn::parse_quote!(#b));
    }
    Ok(quote! {
        impl #impl_g ::tracejit::module::Module for #ident #ty_g #where_clause {
            fn type_name(&self) -> &'static str {
                #type_name
            }
            #name_fn
            fn visit_fields<'tracejit_m>(
                &'tracejit_m self,
                visitor: &mut dyn ::tracejit::module::Visitor<'tracejit_m>,
            ) {
                let _ = &visitor;
                #( #visits )*
            }
        }
        impl #impl_g ::tracejit::module::Visit for #ident #ty_g #where_clause {
            fn visit<'tracejit_m>(&'tracejit_m self, visitor: &mut dyn ::tracejit::module::Visitor<'tracejit_m>) {
                ::tracejit::module::walk(self, visitor)
            }
        }
    })
}

/// True when `ty` contains an identifier from `names` (a type parameter).
fn mentions_any(ty: &syn::Type, names: &[String]) -> bool {
    fn walk(ts: proc_macro2::TokenStream, names: &[String]) -> bool {
        ts.into_iter().any(|tt| match tt {
            proc_macro2::TokenTree::Ident(i) => names.iter().any(|n| i == n),
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), names),
            _ => false,
        })
    }
    !names.is_empty() && walk(quote! { #ty }, names)
}
