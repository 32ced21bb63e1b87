//! Derive macros for tracejit.
//!
//! `#[derive(Nest)]` lets a user struct be a `Function`'s argument or
//! result: its fields flatten in declaration order, exactly as a tuple of the
//! same fields would. (`#[derive(Module)]` joins it with the state work.)

use proc_macro::TokenStream;
use quote::{format_ident, quote};
use syn::{parse_macro_input, Data, DeriveInput, Fields};

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
    let (flatten, unflatten) = match &data.fields {
        Fields::Named(f) => {
            let idents: Vec<_> = f.named.iter().map(|f| f.ident.clone().expect("named")).collect();
            let types: Vec<_> = f.named.iter().map(|f| &f.ty).collect();
            (
                quote! { #( ::tracejit::Nest::flatten(&self.#idents, out); )* },
                quote! { #name { #( #idents: <#types as ::tracejit::Nest>::unflatten(src), )* } },
            )
        }
        Fields::Unnamed(f) => {
            let idx: Vec<syn::Index> = (0..f.unnamed.len()).map(syn::Index::from).collect();
            let types: Vec<_> = f.unnamed.iter().map(|f| &f.ty).collect();
            let vars: Vec<_> = (0..f.unnamed.len()).map(|i| format_ident!("f{i}")).collect();
            (
                quote! { #( ::tracejit::Nest::flatten(&self.#idx, out); )* },
                quote! {{
                    #( let #vars = <#types as ::tracejit::Nest>::unflatten(src); )*
                    #name( #(#vars),* )
                }},
            )
        }
        Fields::Unit => (quote! {}, quote! { #name }),
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
        }
    })
}
