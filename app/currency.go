package app

import "strings"

// iso4217 lists the active ISO 4217 currency codes (fund and precious-metal
// codes excluded: a payment is not made in XAU).
var iso4217 = func() map[string]struct{} {
	const codes = `AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN
BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS
GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD
KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR
NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN
SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VED VES VND VUV WST XAF XCD XCG XOF
XPF YER ZAR ZMW ZWG`
	m := make(map[string]struct{})
	for _, c := range strings.Fields(codes) {
		m[c] = struct{}{}
	}
	return m
}()

// ValidCurrency reports whether code is an active ISO 4217 currency code,
// in upper case.
func ValidCurrency(code string) bool {
	_, ok := iso4217[code]
	return ok
}
